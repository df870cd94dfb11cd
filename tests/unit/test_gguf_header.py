"""The bounded GGUF reader against well-formed, truncated and hostile files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from llmrun.errors import ModelFileError
from llmrun.formats.gguf_header import read_header
from llmrun.formats.memory import default_context, fits, geometry, kv_cache_bytes, plan
from llmrun.units import format_bytes
from tests.support import ggufbuild as gb


def test_reads_metadata_and_tensors(tmp_path: Path) -> None:
    path = gb.write(
        tmp_path / "m.gguf", {**gb.LLAMA_META, "tokenizer.chat_template": "{{ x }}"}, [("tok_embd.weight", (64, 10), 0)]
    )
    header = read_header(path)
    assert header.architecture == "llama"
    assert header.arch_value("block_count") == 2
    assert header.chat_template == "{{ x }}"
    assert header.tensors[0].shape == (64, 10)
    assert header.weight_bytes == 64 * 10 * 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "too short"),
        (b"PK\x03\x04" + b"\0" * 40, "does not start with 'GGUF'"),
        (b"GGUF" + struct.pack("<IQQ", 99, 0, 0), "unsupported GGUF version"),
        # the 57-byte file that makes the gguf package hang: an array claiming 2**62 items
        (
            b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gb.string("a") + struct.pack("<IIQ", 9, 4, 2**62) + b"\0" * 12,
            "more than the file can hold",
        ),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40), "metadata entries"),
        (b"GGUF" + struct.pack("<IQQ", 3, 2**40, 0), "tensors"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**50) + b"x" * 16, "claims"),
        (
            b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gb.string("k") + struct.pack("<I", 77) + b"\0" * 8,
            "unknown value type",
        ),
    ],
)
def test_hostile_headers_fail_fast_with_a_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError) as info:
        read_header(path)
    assert message in info.value.message
    assert info.value.hint


def test_deeply_nested_arrays_are_refused(tmp_path: Path) -> None:
    nested = struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 1) + b"\0" * 4
    path = tmp_path / "nest.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gb.string("k") + struct.pack("<I", 9) + nested)
    with pytest.raises(ModelFileError, match="nests arrays"):
        read_header(path)


def test_truncated_tensor_data_is_reported(tmp_path: Path) -> None:
    path = gb.write(tmp_path / "cut.gguf", gb.LLAMA_META, [("w", (64, 64), 0)], data=False)
    with pytest.raises(ModelFileError, match="truncated"):
        read_header(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="does not exist"):
        read_header(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="is a directory"):
        read_header(tmp_path)


def test_memory_plan_arithmetic(tmp_path: Path) -> None:
    path = gb.write(tmp_path / "m.gguf", gb.LLAMA_META, [("w", (64, 4), 0)])
    header = read_header(path)
    geom = geometry(header)
    assert geom is not None
    assert (geom.n_layers, geom.n_kv_heads, geom.head_dim_k, geom.context_train) == (2, 2, 16, 2048)
    # layers × kv heads × (k + v dims) × ctx × 2 bytes (f16)
    assert kv_cache_bytes(geom, 1000) == 2 * 2 * (16 + 16) * 1000 * 2
    assert default_context(geom) == 2048
    memory = plan(header, 1000)
    assert memory.total_bytes == memory.weight_bytes + memory.kv_bytes + memory.overhead_bytes
    assert fits(memory, memory.total_bytes) and not fits(memory, memory.total_bytes - 1)


def test_default_context_is_capped() -> None:
    from llmrun.formats.memory import Geometry

    assert default_context(Geometry(1, 1, 1, 1, 131072)) == 4096
    assert default_context(None) == 4096


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"


def test_a_long_vocabulary_is_summarised_and_its_strings_still_checked(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(5000)]
    good = gb.write(tmp_path / "vocab.gguf", {**gb.LLAMA_META, "tokenizer.ggml.tokens": words}, [("w", (8,), 0)])
    summary = read_header(good).metadata["tokenizer.ggml.tokens"]
    assert summary.length == 5000
    raw = gb.header({"tokenizer.ggml.tokens": words})
    cut = raw[: raw.rindex(b"w4999") - 8] + struct.pack("<Q", 2**40) + b"w4999"
    bad = tmp_path / "bad_vocab.gguf"
    bad.write_bytes(cut)
    with pytest.raises(ModelFileError, match="more than the file can hold"):
        read_header(bad)


def test_the_tensor_type_table_agrees_with_the_gguf_package() -> None:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from llmrun.formats.gguf_header import GGML_TYPES

    theirs = {t.value: (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType}
    assert theirs == GGML_TYPES
