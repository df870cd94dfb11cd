"""Parsed GGUF headers are kept per file version, and given back exactly as parsed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmrun.formats.gguf_header import GgufHeader, read_header
from llmrun.formats.header_cache import cached_header, decode, encode
from tests.support import ggufbuild as gb

META = {
    **gb.LLAMA_META,
    "general.name": "tiny ünïcode",
    "llama.rope.freq_base": 10000.5,
    "tokenizer.ggml.tokens": [f"t{i}" for i in range(5000)],  # kept as a summary, not a list
    "tokenizer.ggml.scores": [0.25, -1.5],
    "tokenizer.ggml.add_bos_token": True,
}


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, path: Path) -> GgufHeader:
        self.calls += 1
        return read_header(path)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return gb.write(tmp_path / "tiny.gguf", META, [("token_embd.weight", (64, 4), 0), ("output.weight", (64, 4), 0)])


def test_a_header_survives_the_round_trip_exactly(model: Path) -> None:
    header = read_header(model)
    assert decode(encode(header), model) == header


def test_the_second_read_comes_from_the_cache_until_the_file_changes(model: Path, tmp_path: Path) -> None:
    cache, read = tmp_path / "cache", Counting()
    first = cached_header(model, read, cache)
    again = cached_header(model, read, cache)
    assert read.calls == 1 and again == first
    os.utime(model, ns=(1, 1))  # rewritten in place: another modification time
    assert cached_header(model, read, cache) == first and read.calls == 2
    gb.write(model, {**META, "general.name": "another"})
    assert cached_header(model, read, cache).metadata["general.name"] == "another" and read.calls == 3


def test_a_damaged_entry_is_parsed_again_and_replaced(model: Path, tmp_path: Path) -> None:
    cache, read = tmp_path / "cache", Counting()
    cached_header(model, read, cache)
    (entry,) = cache.iterdir()
    for damage in ("{", '{"format": 1}', "[]", '{"format": 1, "path": 3, "stamp": 4, "header": {}}'):
        entry.write_text(damage)
        assert cached_header(model, read, cache) == read_header(model)
    assert cached_header(model, read, cache) == read_header(model)
    assert read.calls == 5  # each damage parsed once, then the rewritten entry served
    assert [p.name for p in cache.iterdir()] == [entry.name]  # no temporary files left


def test_errors_are_the_parsers_and_a_read_only_cache_is_skipped(tmp_path: Path, model: Path) -> None:
    from llmrun.errors import ModelFileError

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 40)
    with pytest.raises(ModelFileError):
        cached_header(broken, read_header, tmp_path / "cache")
    with pytest.raises(ModelFileError):
        cached_header(tmp_path / "missing.gguf", read_header, tmp_path / "cache")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    assert cached_header(model, read_header, blocked) == read_header(model)


@pytest.mark.slow
def test_the_packaged_gemmas_header_survives_the_round_trip(gemma_cache: Path, tmp_path: Path) -> None:
    header = read_header(gemma_cache)
    assert decode(encode(header), gemma_cache) == header
    cached_header(gemma_cache, read_header, tmp_path)
    assert cached_header(gemma_cache, read_header, tmp_path) == header
