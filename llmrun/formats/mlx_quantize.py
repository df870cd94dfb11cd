"""Hugging Face / MLX safetensors directory → MLX 4/8-bit, with mlx-lm's own parts.

mlx-lm's ``convert`` would do this too, but it copies the source's ``*.py`` files
(remote code, which llmrun never takes) and asks the Hub for a model card; so the same
steps are composed here from its ``load_model``, ``quantize_model``, ``save_model`` and
``save_config``, and the tokenizer files are copied as they are.
"""

from __future__ import annotations

import fnmatch
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrun.errors import ModelFileError, UsageError
from llmrun.files import Progress
from llmrun.formats.output import check_destination, staged, tree_size

MLX_QUANT_BITS = (4, 8)
_TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "*.jinja", "generation_config.json", "*.tiktoken")


@dataclass(frozen=True, slots=True)
class QuantizedDir:
    path: Path
    model_type: str
    bits: int
    group_size: int
    bits_per_weight: float
    size_bytes: int
    seconds: float


def read_config(directory: Path) -> dict[str, Any]:
    """A model directory's ``config.json`` (it must have safetensors beside it)."""
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory", "pass a Hugging Face or MLX model directory")
    from llmrun.formats.mlx_header import is_mlx_dir, read_json

    if not is_mlx_dir(directory):
        raise UsageError(
            f"{directory} is not a model directory (it needs config.json and *.safetensors)",
            "pass a Hugging Face or MLX model directory, or a .gguf file",
        )
    path = directory / "config.json"
    config = read_json(path, "model config JSON")
    if not isinstance(config, dict):
        raise ModelFileError(f"{path} is not a JSON object", "the model directory is damaged")
    return config


def quantize_mlx(
    source: Path,
    dest: Path,
    *,
    bits: int = 4,
    group_size: int = 64,
    force: bool = False,
    progress: Progress | None = None,
) -> QuantizedDir:
    from llmrun.formats.convert import check_bits, quantize_model

    if bits not in MLX_QUANT_BITS:
        raise UsageError(f"`bits` must be 4 or 8 for MLX, got {bits}", "")
    check_bits(bits, group_size)
    started = time.perf_counter()
    config = read_config(source)
    if "quantization" in config or "quantization_config" in config:
        raise UsageError(
            f"{source} is already quantized",
            "quantize from the 16-bit model (llmrun convert SRC.gguf --to mlx --bits 16 makes one)",
        )
    check_destination(dest, force, tree_size(source) * (bits + 1) // 16 + 1, directory=True)
    step = progress or (lambda what, done, total: None)
    from llmrun.formats.mlx_runtime import prepare_mlx

    prepare_mlx()
    import mlx.core as mx
    from mlx_lm.utils import compute_bits_per_weight, load_model, save_config, save_model

    step("load the model", 0, 1)
    model, config = load_model(source, lazy=True, strict=True)
    step("load the model", 1, 1)
    with staged(dest, force, directory=True) as staging:
        step(f"quantize to {bits} bit", 0, 1)
        model, config = quantize_model(model, config, group_size, bits)
        mx.eval(model.parameters())
        step(f"quantize to {bits} bit", 1, 1)
        bits_per_weight = float(compute_bits_per_weight(model))
        step("write safetensors", 0, 1)
        save_model(staging, model)
        save_config(config, staging / "config.json")
        _copy_tokenizer(source, staging)
        step("write safetensors", 1, 1)
    seconds = time.perf_counter() - started
    model_type = str(config.get("model_type", "unknown"))
    return QuantizedDir(dest, model_type, bits, group_size, bits_per_weight, tree_size(dest), seconds)


def _copy_tokenizer(source: Path, dest: Path) -> None:
    copied = 0
    for path in sorted(source.iterdir()):
        if path.is_file() and any(fnmatch.fnmatch(path.name, p) for p in _TOKENIZER_FILES):
            shutil.copy2(path, dest / path.name)
            copied += 1
    if not copied:
        raise ModelFileError(f"{source} has no tokenizer files", "the model directory needs tokenizer.json")
