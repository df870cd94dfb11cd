"""``llmrun doctor``: versions, hardware, locations, and each problem with its fix."""

from __future__ import annotations

import typer

from llmrun.cli import options as o


def doctor(json_output: o.JsonOpt = False) -> None:
    """Check this machine: platform, Python, llama.cpp and MLX builds, GPU offload, memory, disk, paths.

    Each problem comes with the exact command that fixes it. The exit code is 1 when one stops llmrun from
    running (an error); problems that only make it slower or less capable (warnings) leave it 0.
    """
    from llmrun.cli import render
    from llmrun.engine import doctor as checks
    from llmrun.units import format_bytes

    with render.status("Checking…"):
        facts = checks.gather()
    problems = checks.diagnose(facts)
    data = checks.report(facts)
    if json_output:
        from llmrun.api.flags import FLAGS
        from llmrun.errors import word

        shown = [{"what": word(p.what, FLAGS), "fix": word(p.fix, FLAGS), "severity": p.severity} for p in problems]
        render.print_json({**data, "problems": shown})
    else:
        v = data["versions"]
        gpu = data["llama_cpp"]["gpu_offload"]
        rows = [
            ("platform", data["platform"]),
            ("python", data["python"]),
            *((name, version or "not installed") for name, version in v.items()),
            ("llama.cpp GPU offload", "unknown" if gpu is None else "yes" if gpu else "no (CPU only)"),
            ("llama.cpp CPU features", " ".join(data["llama_cpp"]["cpu_features"]) or "—"),
            ("CPU features it leaves unused", " ".join(data["llama_cpp"]["cpu_features_unused"]) or "none"),
            ("llama.cpp AMX kernels", data["llama_cpp"]["amx"]),
            ("llama.cpp RPC backend", _rpc(data["llama_cpp"]["rpc"])),
            ("MLX default device", data["mlx"]["default_device"] or "—"),
            *([("MLX CPU BLAS", data["mlx"]["blas"])] if data["mlx"]["blas"] else []),
            (
                "memory",
                f"{format_bytes(data['memory']['available'])} available of {format_bytes(data['memory']['total'])}",
            ),
            ("disk free (store)", format_bytes(data["disk_free"])),
            *data["paths"].items(),
            ("offline", "yes" if data["offline"] else "no"),
        ]
        render.table("", ["", ""], rows, header=False, stdout=True)  # (llama.cpp's system info: its rows above)
        for problem in problems:
            if problem.severity == "error":
                render.error(problem.what, problem.fix)
            else:
                render.warn(f"{problem.what}\n  fix: {problem.fix}")
        if not problems:
            render.note("no problems found")
    if any(problem.severity == "error" for problem in problems):
        raise typer.Exit(1)


def _rpc(built: bool | None) -> str:
    from llmrun.backends.ggml_rpc import REBUILD

    if built is None:
        return "unknown"
    return (
        "built in (--rpc HOST:PORT,… splits a model across ggml-rpc-server workers)"
        if built
        else (f"not built (for --rpc: {REBUILD})")
    )
