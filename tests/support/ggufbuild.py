"""Build small GGUF files byte by byte, including hostile ones, for tests."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

U32, I32, F32, BOOL, STRING, ARRAY, U64 = 4, 5, 6, 7, 8, 9, 10


def string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def value(v: Any) -> tuple[int, bytes]:
    if isinstance(v, bool):
        return BOOL, struct.pack("<?", v)
    if isinstance(v, int):
        return U32, struct.pack("<I", v)
    if isinstance(v, float):
        return F32, struct.pack("<f", v)
    if isinstance(v, str):
        return STRING, string(v)
    if isinstance(v, list):
        item_type, _ = value(v[0])
        body = b"".join(value(item)[1] for item in v)
        return ARRAY, struct.pack("<IQ", item_type, len(v)) + body
    raise TypeError(v)


def header(metadata: dict[str, Any], tensors: list[tuple[str, tuple[int, ...], int]] = ()) -> bytes:  # type: ignore[assignment]
    """GGUF v3 header bytes; tensors are (name, shape, ggml type id), laid out back to back."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
    for key, v in metadata.items():
        type_id, body = value(v)
        out += string(key) + struct.pack("<I", type_id) + body
    offset = 0
    for name, shape, type_id in tensors:
        out += string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", type_id, offset)
        elements = 1
        for d in shape:
            elements *= d
        offset += elements * 4  # F32 only in these tests
    return bytes(out)


def write(
    path: Path,
    metadata: dict[str, Any],
    tensors: list[tuple[str, tuple[int, ...], int]] = (),  # type: ignore[assignment]
    data: bool = True,
) -> Path:
    raw = header(metadata, tensors)
    pad = -len(raw) % 32
    body = b""
    if data:
        body = b"\0" * sum(4 * _count(shape) for _, shape, _ in tensors)
    path.write_bytes(raw + b"\0" * pad + body)
    return path


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


LLAMA_META: dict[str, Any] = {
    "general.architecture": "llama",
    "llama.block_count": 2,
    "llama.embedding_length": 64,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.context_length": 2048,
}


HUGE_META: dict[str, Any] = {
    # a well-formed header whose KV cache at 2048 tokens needs 256 GiB
    **LLAMA_META,
    "llama.block_count": 512,
    "llama.embedding_length": 65536,
    "llama.attention.head_count": 64,
    "llama.attention.head_count_kv": 64,
    "tokenizer.ggml.model": "llama",
    "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"],
    "tokenizer.ggml.scores": [0.0, 0.0, 0.0, 0.0],
    "tokenizer.ggml.token_type": [2, 3, 3, 1],
}


def write_huge(path: Path, **overrides: Any) -> Path:
    return write(path, {**HUGE_META, **overrides}, [("token_embd.weight", (64, 4), 0)])
