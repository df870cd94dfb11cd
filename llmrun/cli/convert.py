"""``llmrun convert``: a GGUF model → an MLX model directory."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from llmrun.errors import UsageError


def convert(
    source: Annotated[str, typer.Argument(help="A .gguf file or a model name (gemma3:270m).", show_default=False)],
    to: Annotated[str, typer.Option("--to", help="Target format: mlx.")] = "mlx",
    bits: Annotated[int, typer.Option("--bits", help="4 or 8 (MLX affine quantization) or 16 (bfloat16).")] = 16,
    group_size: Annotated[int, typer.Option("--group-size", help="Quantization group size: 32, 64 or 128.")] = 64,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Output directory. Default: ./<name>-mlx-<bits>bit.", show_default=False),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output directory.")] = False,
) -> None:
    """Convert a GGUF (any quant type the gguf package can dequantize) into an MLX model directory.

    Supported architectures: gemma3, llama, qwen2. The result loads in mlx-lm with strict
    weight checking and runs with --backend mlx.

    Example: llmrun convert gemma3:270m --to mlx --bits 8 -o gemma-270m-mlx-8bit
    """
    from llmrun.cli import render
    from llmrun.config import load_registry
    from llmrun.memory import format_bytes
    from llmrun.pipeline import locate
    from llmrun.quantize.convert import check_bits, gguf_to_mlx

    if to != "mlx":
        raise UsageError(f"--to must be mlx, got {to!r}", "GGUF → MLX is the conversion llmrun offers")
    check_bits(bits, group_size)
    from llmrun.backends.select import this_platform

    if not this_platform().mlx_installed:
        raise UsageError("converting to MLX needs mlx-lm, which is not installed", "pip install 'llmrun[mlx]'")
    with render.download_progress() as progress:
        located = locate(load_registry(), source, progress, backend="gguf")
    name = re.sub(
        r"[^A-Za-z0-9._-]+", "-", Path(located.model.name).stem if located.model.entry is None else located.model.name
    )
    dest = output or Path(f"{name}-mlx-{bits}bit")
    shown = str(dest) if dest.is_absolute() or str(dest).startswith(".") else f"./{dest}"  # a path, not a name
    with render.work_progress() as progress:
        result = gguf_to_mlx(located.model.path, dest, bits=bits, group_size=group_size, force=force, progress=progress)
    render.note(
        f"wrote {result.path} ({result.architecture}, {bits}-bit: {result.bits_per_weight:.2f} bits per weight, "
        f"{result.tensors} tensors, {format_bytes(result.size_bytes)}) in {result.seconds:.1f} s"
    )
    render.note(f'run it: llmrun run -m {shown} "Hello"')
