"""``llmrun bench``: prompt processing and generation speed, llama-bench style."""

from __future__ import annotations

import csv
import io
from typing import Annotated, Any

import typer

from llmrun.backends.base import KV_TYPES
from llmrun.cli import options as o
from llmrun.errors import UsageError


def bench(
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="Model to measure (repeatable). Default: the default model."),
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", help="auto, gguf or mlx; several as a comma list (gguf,mlx).")
    ] = "auto",
    n_prompt: Annotated[int, typer.Option("--n-prompt", "-p", min=1, help="Prompt tokens to process.")] = 512,
    n_gen: Annotated[int, typer.Option("--n-gen", "-n", min=1, help="Tokens to generate.")] = 128,
    repetitions: Annotated[
        int, typer.Option("--repetitions", "-r", min=1, help="Timed repetitions (after one warm-up).")
    ] = 5,
    kv_type: Annotated[
        str, typer.Option("--kv-type", help=f"KV cache types, comma separated ({', '.join(KV_TYPES)}).")
    ] = "f16",
    threads: o.ThreadsOpt = None,
    rpc: o.RpcOpt = None,
    rpc_allow_remote: o.RpcAllowRemoteOpt = False,
    draft: o.DraftOpt = None,
    draft_tokens: o.DraftTokensOpt = None,
    json_output: o.JsonOpt = False,
    csv_output: Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")] = False,
) -> None:
    """Measure prompt processing (pp) and generation (tg) speed, time to first token and memory.

    Medians and standard deviations over the repetitions, for each model × backend × KV type.

    Example: llmrun bench -p 256 -n 64 -r 3 --kv-type f16,q8_0
    """
    from llmrun import backends
    from llmrun.backends.base import LoadParams
    from llmrun.backends.rpc import workers as rpc_workers
    from llmrun.cli import render, views
    from llmrun.engine import benchmark
    from llmrun.engine.load import attach_draft, load_defaults
    from llmrun.engine.plan import locate
    from llmrun.engine.select import BACKEND_CHOICES
    from llmrun.models.registry import load_registry

    kv_types = _choices(kv_type, KV_TYPES, "--kv-type")
    backend_names = _choices(backend, BACKEND_CHOICES, "--backend")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be an integer >= 1, got {threads}", "pass --threads 1 or more")
    chosen_draft = o.draft_choice(draft, draft_tokens)
    workers: tuple[str, ...] = o.load_values(None, None, None, rpc=rpc, rpc_allow_remote=rpc_allow_remote)["rpc"] or ()
    registry = load_registry()
    defaults = load_defaults()
    rows: list[dict[str, Any]] = []
    names: list[str | None] = list(model) if model else [None]
    for name in names:
        for requested in backend_names:
            located = locate(registry, name, backend=requested)
            backend_name = located.backend.backend
            if workers and backend_name != "gguf":
                raise UsageError(
                    f"--rpc workers run llama.cpp; {located.model.name} runs on {backend_name}", "drop --rpc"
                )
            rpc_workers(workers)
            for kv in kv_types:
                params = LoadParams(
                    n_ctx=max(n_prompt + n_gen + 16, 64),
                    n_threads=threads or defaults["n_threads"],
                    n_gpu_layers=-1 if workers else defaults["n_gpu_layers"],
                    kv_type=kv,
                    rpc=workers,
                )
                label = f"{located.model.name} · {backend_name} · KV {kv}"
                with render.status(f"Loading {label}…") as spinner:
                    loaded = backends.get(backend_name).load(located.model.path, params)
                    try:
                        if chosen_draft is not None and chosen_draft.on:
                            spinner.update(f"Loading the draft for {label}…")
                            draft_path = None
                            if chosen_draft.model:
                                draft_path = locate(registry, chosen_draft.model, backend=backend_name).model.path
                            attach_draft(loaded, backend_name, params, chosen_draft, draft_path)
                        result = benchmark.run(
                            loaded,
                            n_prompt,
                            n_gen,
                            repetitions,
                            _rss,
                            progress=lambda i, label=label, spinner=spinner: spinner.update(  # type: ignore[misc]
                                f"{label}: run {i + 1} of {repetitions + 1}…"
                            ),
                        )
                    finally:
                        loaded.close()
                rows.append(_row(located.model.name, backend_name, kv, params.n_threads, result))
    if json_output:
        render.print_json(rows)
    elif csv_output:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        typer.echo(buffer.getvalue(), nl=False)
    else:
        views.bench_table(rows)


def _choices(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in chosen if v not in allowed]
    if bad or not chosen:
        raise UsageError(
            f"{flag} {value!r}: unknown value {bad[0] if bad else ''!r}", f"choose from {', '.join(allowed)}"
        )
    return chosen


def _row(model: str, backend: str, kv: str, threads: int, result: Any) -> dict[str, Any]:
    row = {
        "model": model,
        "backend": backend,
        "kv_type": kv,
        "threads": threads,
        "n_prompt": result.n_prompt,
        "n_gen": result.n_gen,
        "repetitions": result.repetitions,
        "pp_tokens_per_s": round(result.pp_tps.median, 2),
        "pp_stdev": round(result.pp_tps.stdev, 2),
        "tg_tokens_per_s": round(result.tg_tps.median, 2),
        "tg_stdev": round(result.tg_tps.stdev, 2),
        "ttft_s": round(result.ttft_s.median, 4),
        "ttft_stdev": round(result.ttft_s.stdev, 4),
        "peak_rss_bytes": result.rss_bytes,
    }
    spec = result.speculative
    if spec is not None:
        row |= {
            "draft": spec.draft,
            "plain_tokens_per_s": round(spec.plain_tps.median, 2),
            "draft_tokens_per_s": round(spec.draft_tps.median, 2),
            "speedup": round(spec.speedup, 3),
            "drafted": spec.drafted,
            "accepted": spec.accepted,
            "acceptance": round(spec.acceptance, 3) if spec.acceptance is not None else None,
            "same_output": spec.same_output,
        }
    return row


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)
