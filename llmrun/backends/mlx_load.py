"""What loading an MLX model does beyond mlx-lm's own load: the tokenizer kept per process, and the dtype
a model computes in on the CPU (see :mod:`llmrun.formats.mlx_runtime`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmrun.formats.mlx_runtime import computes_in_float32


def on_the_cpu_in_float32(model: Any, blas: str | None) -> None:
    """On the CPU with a fast BLAS, a model whose float32 weights fit computes in float32 (see
    :mod:`llmrun.formats.mlx_runtime`: about 20 times faster than mlx's CPU bfloat16)."""
    import mlx.core as mx
    import psutil
    from mlx.utils import tree_flatten

    if mx.default_device() != mx.cpu:
        return
    flat: Any = tree_flatten(model.parameters())
    weights = [value for _, value in flat]
    if any(v.dtype not in (mx.float32, mx.float16, mx.bfloat16) for v in weights):
        return  # quantized weights stay as they are
    if computes_in_float32(sum(v.size for v in weights), psutil.virtual_memory().available, blas):
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())


_TOKENIZERS: dict[tuple[tuple[int, ...] | None, tuple[tuple[str, str], ...]], Any] = {}
_DIGESTS: dict[tuple[str, int, int], str] = {}
KEPT_TOKENIZERS = 4
TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "added_tokens", "chat_template", "vocab", "merges")


def kept_tokenizer(path: Path, eos: tuple[int, ...] | None, load: Callable[..., Any]) -> Any:
    """The directory's transformers tokenizer, kept per process by its files' contents: reading one takes
    seconds (Gemma's tokenizer.json is 33 MB of JSON, parsed several times over), and a model is loaded
    again on a reload, a model switch, a draft of the same family — or is a copy with the same tokenizer
    (a model quantized or converted here, the same model pulled twice). llmrun only reads it."""
    key = (eos, _tokenizer_files(path))
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) >= KEPT_TOKENIZERS:
            del _TOKENIZERS[next(iter(_TOKENIZERS))]
        _TOKENIZERS[key] = load(path, eos_token_ids=list(eos) if eos is not None else None)._tokenizer
    return _TOKENIZERS[key]


def _tokenizer_files(path: Path) -> tuple[tuple[str, str], ...]:
    """(name, content digest) of every file the tokenizer is read from; config.json by its ``model_type``
    alone (which tokenizer class a directory without one in tokenizer_config.json gets)."""
    import hashlib
    import json

    found = []
    for file in sorted(path.iterdir()):
        if not file.is_file():
            continue
        if file.name == "config.json":
            with contextlib.suppress(OSError, ValueError, AttributeError):
                found.append((file.name, str(json.loads(file.read_text(encoding="utf-8")).get("model_type"))))
            continue
        if file.name.startswith(TOKENIZER_FILES) or file.suffix in (".model", ".jinja", ".tiktoken"):
            stat = file.stat()
            seen = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
            if seen not in _DIGESTS:
                with file.open("rb") as opened:
                    _DIGESTS[seen] = hashlib.file_digest(opened, "blake2b").hexdigest()
            found.append((file.name, _DIGESTS[seen]))
    return tuple(found)
