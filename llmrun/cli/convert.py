"""``llmrun convert``: a GGUF model → an MLX model directory."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmrun.errors import UsageError

if TYPE_CHECKING:
    from llmrun.engine.plan import Located


def convert(
    source: Annotated[
        str,
        typer.Argument(
            help="A .gguf file, a model name (gemma3:270m), or (for --to gguf) a Hugging Face safetensors directory.",
            show_default=False,
        ),
    ],
    to: Annotated[str, typer.Option("--to", help="Target format: mlx, or gguf (unquantized).")] = "mlx",
    bits: Annotated[int, typer.Option("--bits", help="MLX: 4 or 8 (affine quantization) or 16 (bfloat16).")] = 16,
    out_type: Annotated[str, typer.Option("--type", help="GGUF: f16, bf16 or f32 (every tensor dequantized).")] = "f16",
    group_size: Annotated[int, typer.Option("--group-size", help="Quantization group size: 32, 64 or 128.")] = 64,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Output. Default: ./NAME-mlx-BITSbit or ./NAME-TYPE.gguf.", show_default=False
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output directory.")] = False,
) -> None:
    """Convert a GGUF (any quant type the gguf package can dequantize) into an MLX model directory,
    or into an unquantized GGUF (F16/BF16/F32: a source for llmrun quantize and its reference).

    MLX: architectures gemma3, llama, qwen2; the result loads in mlx-lm with strict weight
    checking and runs with --backend mlx. GGUF from a safetensors directory: gemma3, llama,
    qwen2, and BERT sentence-embedding models (for llmrun index --embed-model).

    Examples:
      llmrun convert gemma3:270m --to mlx --bits 8 -o gemma-270m-mlx-8bit
      llmrun convert gemma3:270m --to gguf --type f16 -o gemma-270m-f16.gguf
      llmrun convert ./all-MiniLM-L6-v2 --to gguf -o all-minilm-l6-v2-f16.gguf
    """
    from llmrun.cli import bars, render
    from llmrun.engine.plan import locate
    from llmrun.formats.convert import check_bits, gguf_to_mlx
    from llmrun.models.registry import load_registry
    from llmrun.units import format_bytes

    if to not in ("mlx", "gguf"):
        raise UsageError(f"--to must be mlx or gguf, got {to!r}", "")
    if to == "gguf":
        _to_gguf(source, out_type, output, force)
        return
    check_bits(bits, group_size)
    from llmrun.engine.select import this_platform

    if not this_platform().mlx_installed:
        raise UsageError("converting to MLX needs mlx-lm, which is not installed", "pip install 'llmrun[mlx]'")
    with bars.download_progress() as progress:
        located = locate(load_registry(), source, progress, backend="gguf")
    dest = output or Path(f"{_base_name(located)}-mlx-{bits}bit")
    shown = _shown(dest)
    with bars.work_progress() as progress:
        result = gguf_to_mlx(located.model.path, dest, bits=bits, group_size=group_size, force=force, progress=progress)
    render.note(
        f"wrote {result.path} ({result.architecture}, {bits}-bit: {result.bits_per_weight:.2f} bits per weight, "
        f"{result.tensors} tensors, {format_bytes(result.size_bytes)}) in {result.seconds:.1f} s"
    )
    render.note(f'run it: llmrun run -m {shown} "Hello"')


def _base_name(located: Located) -> str:
    model = located.model
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model.name).stem if model.entry is None else model.name)


def _shown(path: Path) -> str:
    """A path as a model name: ``./`` in front of a relative one (a bare name would be an alias)."""
    return str(path) if path.is_absolute() or str(path).startswith(".") else f"./{path}"


def _to_gguf(source: str, out_type: str, output: Path | None, force: bool) -> None:
    from llmrun.cli import bars, render
    from llmrun.engine.plan import locate
    from llmrun.formats.f16 import float_type, gguf_to_float
    from llmrun.models.registry import load_registry
    from llmrun.units import format_bytes

    kind = float_type(out_type)
    if Path(source).is_dir():
        from llmrun.formats.hf_gguf import hf_to_gguf

        directory = Path(source)
        dest = output or Path(f"{directory.resolve().name.lower()}-{kind.lower()}.gguf")
        with bars.work_progress() as progress:
            result = hf_to_gguf(directory, dest, kind, force=force, progress=progress)
    else:
        with bars.download_progress() as progress:
            located = locate(load_registry(), source, progress, backend="gguf")
        dest = output or Path(f"{_base_name(located)}-{kind.lower()}.gguf")
        if dest.resolve() == located.model.path.resolve():
            raise UsageError("the output would replace the source", "choose another -o")
        with bars.work_progress() as progress:
            result = gguf_to_float(located.model.path, dest, kind, force=force, progress=progress)
    render.note(
        f"wrote {result.path} ({result.architecture}, {kind}, {result.tensors} tensors, "
        f"{format_bytes(result.size_bytes)}) in {result.seconds:.1f} s"
    )
    if result.architecture == "bert":
        render.note(f"index with it: llmrun index add DOCS -c NAME --embed-model {_shown(dest)}")
    else:
        render.note(f"quantize it: llmrun quantize {_shown(dest)} --type Q4_K_M")
