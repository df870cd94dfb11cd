"""What loading an MLX model does beyond mlx-lm's own load: the tokenizer kept per process and what llmrun
reads from it (how its tokens spell bytes, which added tokens are markup), and the dtype a model computes in
on the CPU (see :mod:`llmrun.formats.mlx_runtime`)."""

from __future__ import annotations

import contextlib
import json
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


def piece_decoder(tokenizer: Any) -> Callable[[str], bytes]:
    """How a vocabulary entry spells its bytes: byte-level BPE, or sentencepiece with byte fallback."""
    decoder = _decoder_spec(tokenizer)
    if "ByteLevel" in json.dumps(decoder):
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        table = {char: byte for byte, char in bytes_to_unicode().items()}
        return lambda token: bytes(table[c] for c in token if c in table)

    def sentencepiece(token: str) -> bytes:
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            with contextlib.suppress(ValueError):
                return bytes([int(token[3:5], 16)])
        return token.replace("\u2581", " ").encode("utf-8")

    return sentencepiece


def _decoder_spec(tokenizer: Any) -> Any:
    """The tokenizer's decoder as tokenizers describes it in JSON: from the decoder alone (serializing the
    whole tokenizer for it took 1–2 s for Gemma's 262k-token vocabulary, on every load)."""
    backend = tokenizer.backend_tokenizer
    decoder = backend.decoder
    if decoder is None:
        return {}
    try:
        return json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        return json.loads(backend.to_str()).get("decoder") or {}


def markup_ids(tokenizer: Any) -> set[int]:
    """Added tokens that are markup though not marked special (as GGUF's user-defined tokens come out of
    a conversion: Gemma 3's ``<start_of_image>``), kept out of answers as llama.cpp's are here
    (:mod:`llmrun.decoding.markers`)."""
    from llmrun.decoding.markers import is_hidden_marker

    added = tokenizer.added_tokens_decoder
    return {int(i) for i, token in added.items() if not token.special and is_hidden_marker(str(token.content))}
