"""An MLX model directory described as a :class:`GgufHeader`, so planning, ``show`` and the
memory plan read one shape of model facts whatever the backend.

``config.json`` gives the geometry under GGUF's key names; each safetensors file's
JSON header (bounded: its declared length is checked against the file) gives the
tensors; the chat template comes from ``chat_template.jinja`` or ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from llmrun.errors import ModelFileError
from llmrun.formats.gguf_header import ArraySummary, GgufHeader, TensorInfo

MAX_JSON_BYTES = 64 * 1024 * 1024  # a safetensors header or config file beyond this is refused
ARCHITECTURES = {"gemma3_text": "gemma3", "gemma3": "gemma3"}
# safetensors dtype → the closest GGML type id (for the weights-by-type table)
DTYPES = {"F32": 0, "F16": 1, "BF16": 30, "I8": 24, "U8": 24, "I16": 25, "I32": 26, "U32": 26, "I64": 27, "F64": 28}
_CONFIG_KEYS = {
    "num_hidden_layers": "block_count",
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "max_position_embeddings": "context_length",
    "sliding_window": "attention.sliding_window",
    "sliding_window_pattern": "attention.sliding_window_pattern",
    "rope_theta": "rope.freq_base",
}


def read_json(path: Path, what: str) -> Any:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise ModelFileError(f"{path} is too large to be {what}", "check the model directory")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path} is not valid {what}: {exc}", "re-download or re-convert the model") from exc


def safetensors_table(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header table (bounded) and where its data starts."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ModelFileError(f"{path} is not a safetensors file (too short)", "re-download or re-convert the model")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_JSON_BYTES, size - 8):
            raise ModelFileError(
                f"{path} declares a {length}-byte header in a {size}-byte file", "re-download or re-convert the model"
            )
        try:
            table = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelFileError(f"{path} has a corrupt safetensors header", "re-download the model") from exc
    if not isinstance(table, dict):
        raise ModelFileError(f"{path} has a corrupt safetensors header", "re-download the model")
    return table, 8 + length


def _tensors(path: Path) -> list[TensorInfo]:
    table, _ = safetensors_table(path)
    result = []
    for name, spec in table.items():
        if name == "__metadata__" or not isinstance(spec, dict):
            continue
        offsets, shape, dtype = spec.get("data_offsets", [0, 0]), spec.get("shape", []), spec.get("dtype", "")
        if not (_naturals(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1]) or not _naturals(shape):
            raise ModelFileError(f"{path}: tensor {name!r} has a malformed shape or offsets", "re-download the model")
        kind = DTYPES.get(dtype, 0) if isinstance(dtype, str) else 0
        result.append(TensorInfo(name, kind, tuple(shape), offsets[0], offsets[1] - offsets[0]))
    return result


def _naturals(value: Any) -> bool:
    """A list of non-negative integers (JSON's, not booleans)."""
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def chat_template(directory: Path, name: str = "default") -> str | None:
    """The model's chat template (``chat_template.jinja``, else ``tokenizer_config.json``'s), or a
    named one (``tool_use``) where the config lists several as ``[{"name", "template"}]``."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file() and name == "default":
        return jinja.read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if config.is_file():
        data = read_json(config, "tokenizer config JSON")
        value = data.get("chat_template") if isinstance(data, dict) else None
        if isinstance(value, str):
            return value if name == "default" else None
        if isinstance(value, list):
            named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
            found = named.get(name)
            return found if isinstance(found, str) else None
    return None


def read_mlx_header(directory: Path) -> GgufHeader:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelFileError(
            f"{directory} is not a model directory (no config.json)", "point at an MLX model directory or a .gguf file"
        )
    config = read_json(config_path, "model config JSON")
    if not isinstance(config, dict):
        raise ModelFileError(f"{config_path} is not a JSON object", "re-download or re-convert the model")
    text_config = config.get("text_config")
    config = {**config, **(text_config if isinstance(text_config, dict) else {})}
    model_type = str(config.get("model_type", "unknown"))
    arch = ARCHITECTURES.get(model_type, model_type)
    metadata: dict[str, Any] = {"general.architecture": arch, "general.name": directory.name}
    for key, gguf_key in _CONFIG_KEYS.items():
        if isinstance(config.get(key), int | float) and not isinstance(config.get(key), bool):
            metadata[f"{arch}.{gguf_key}"] = config[key]
    if f"{arch}.attention.key_length" in metadata:
        metadata[f"{arch}.attention.value_length"] = metadata[f"{arch}.attention.key_length"]
    vocab = config.get("vocab_size")
    if isinstance(vocab, int):
        metadata["tokenizer.ggml.tokens"] = ArraySummary(8, vocab)
    quantization = config.get("quantization")
    if isinstance(quantization, dict) and isinstance(quantization.get("bits"), int):
        metadata["mlx.quantization.bits"] = quantization["bits"]
    for name, key in (("default", "tokenizer.chat_template"), ("tool_use", "tokenizer.chat_template.tool_use")):
        template = chat_template(directory, name)
        if template:
            metadata[key] = template
    files = sorted(directory.glob("*.safetensors"))
    tensors = tuple(t for f in files for t in _tensors(f))
    size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
    return GgufHeader(directory, 0, metadata, tensors, 0, size)


def quiet_transformers() -> None:
    """mlx-lm imports transformers, which prints "PyTorch was not found" unless told to keep quiet."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def is_mlx_dir(path: Path) -> bool:
    """An MLX / Hugging Face model directory: ``config.json`` and safetensors weights."""
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def describes_vision(config: Any) -> bool:
    """Whether an MLX model's config describes a vision model (a ``vision_config``: a vision tower that reads
    images through mlx-vlm)."""
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def has_vision_tower(path: Path) -> bool:
    """An MLX vision model's directory (:func:`describes_vision` of its config)."""
    if not is_mlx_dir(path):
        return False
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return describes_vision(config)
