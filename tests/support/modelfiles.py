"""Small model-adjacent files, built byte by byte, for the tests and the fuzz seeds (fuzz/make_seeds.py):
safetensors headers, importance matrices (llama-imatrix's legacy .dat and its GGUF), an MLX config."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

# a Gemma 3 270M-shaped config.json, as an MLX model directory has it
GEMMA3_CONFIG = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 18,
    "hidden_size": 640,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "max_position_embeddings": 32768,
    "sliding_window": 512,
    "vocab_size": 262144,
}


def safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], declared: int | None = None) -> Path:
    """A safetensors file of 2-D tensors (2 bytes an element, zeros); ``declared`` overrides the header length."""
    table, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = 2 * shape[0] * shape[1]
        table[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(table).encode()
    path.write_bytes(struct.pack("<Q", declared or len(head)) + head + b"\0" * offset)
    return path


def legacy_imatrix(path: Path, entries: dict[str, tuple[int, list[float]]]) -> Path:
    """llama-imatrix's .dat: per tensor, its name, the number of calls and the summed values."""
    data = struct.pack("<i", len(entries))
    for name, (ncall, values) in entries.items():
        encoded = name.encode()
        data += struct.pack("<i", len(encoded)) + encoded + struct.pack("<ii", ncall, len(values))
        data += struct.pack(f"<{len(values)}f", *values)
    path.write_bytes(data)
    return path


def gguf_imatrix(path: Path) -> Path:
    """llama-imatrix's GGUF: one matrix's summed squares (``in_sum2``) and its call counts."""
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "imatrix")
    writer.add_tensor("blk.0.ffn_up.weight.in_sum2", np.array([[2.0, 4.0], [9.0, 3.0]], dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up.weight.counts", np.array([[2.0], [3.0]], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
