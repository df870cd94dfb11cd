"""The KV store's files and rules, without a model: whole files only, checked before use, longest prefix
first, a conversation kept in one file, least recently used removed first."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from llmrun.errors import UsageError
from llmrun.models import kv_store
from llmrun.models.kv_store import MIN_REUSE, MIN_SAVE, KvStore, entries, model_key, read_entry
from llmrun.units import parse_size

LABEL = {"model": "test:model", "backend": "gguf", "kv_type": "f16"}


def store(tmp_path: Path, key: str = "k" * 32, limit: int = 10**9) -> KvStore:
    return KvStore(key, LABEL, directory=tmp_path / "kv", limit=limit)


def doc(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


def test_an_entry_round_trips_with_its_tokens_and_payload(tmp_path: Path) -> None:
    kv = store(tmp_path)
    tokens = doc(MIN_SAVE)
    entry = kv.save(tokens, b"cells" * 100)
    assert entry is not None
    again = read_entry(entry.path)
    assert again.tokens == tuple(tokens) and again.label == LABEL and again.key == kv.key
    assert kv.load(again) == b"cells" * 100
    assert not list(entry.path.parent.glob(".partial-*"))  # landed whole


def test_lookup_finds_the_longest_common_prefix_less_the_last_prompt_token(tmp_path: Path) -> None:
    kv = store(tmp_path)
    short, long = doc(MIN_SAVE), doc(MIN_SAVE + 100)
    kv.save(short, b"short")
    kv.save([*long[:-50], *doc(50, 9000)], b"other tail")  # shares MIN_SAVE + 50 tokens with `long`
    found = kv.lookup(long)
    assert found is not None
    entry, usable = found
    assert entry.tokens[-1] == 9049 and usable == MIN_SAVE + 50
    # the same prompt again: everything but its last token, which is evaluated for its logits
    found = kv.lookup(short)
    assert found is not None and found[1] == MIN_SAVE - 1
    # nothing better than what the model's cells already hold, nothing under MIN_REUSE
    assert kv.lookup(long, better_than=MIN_SAVE + 50) is None
    assert kv.lookup(doc(MIN_REUSE - 1)) is None
    assert kv.lookup(doc(MIN_SAVE, start=5)) is None


def test_a_longer_conversation_replaces_the_entry_it_extends(tmp_path: Path) -> None:
    kv = store(tmp_path)
    turn1 = doc(MIN_SAVE)
    turn2 = [*turn1, *doc(40, 7000)]
    kv.save(turn1, b"1")
    assert not kv.wanted(turn1)  # already held
    assert kv.wanted(turn2)
    kv.save(turn2, b"2", replace_shorter=True)
    assert [len(e.tokens) for e in entries(kv.directory)] == [len(turn2)]
    assert not kv.wanted(turn1)  # held inside the longer entry
    assert not kv.wanted(doc(MIN_SAVE - 1, start=1))  # too short to keep
    kv.save([*turn2, 5], b"3")  # a prompt's point: the entries it extends stay
    assert len(list(entries(kv.directory))) == 2


def test_a_sliding_window_store_uses_only_entries_the_prompt_holds_whole(tmp_path: Path) -> None:
    """A sliding-window cache saves only its window: a kept prefix cannot be cut shorter."""
    kv = store(tmp_path)
    kv.whole = True
    document, answer = doc(MIN_SAVE + 40), doc(10, start=7000)
    kv.save([*document, *answer], b"turn")
    question = [*document, *doc(20, start=8000)]
    assert kv.lookup(question) is None  # it would have to be cut back to the document
    assert kv.wanted(document)  # so the document alone is worth its own entry
    # where the new question leaves the kept turn: the document's end, a boundary worth keeping
    assert kv.branch(question) == len(document)
    kv.save(document, b"document")
    assert kv.branch(question) == 0  # kept now
    found = kv.lookup(question)
    assert found is not None and found[1] == len(document) and found[0].tokens == tuple(document)
    # without a window the longer entry serves, cut back, and the document needs no entry of its own
    kv.whole = False
    assert not kv.wanted(document[:-1])


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "foreign"])
def test_a_damaged_truncated_or_foreign_file_is_removed_never_loaded(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    kv = store(tmp_path)
    tokens = doc(MIN_SAVE)
    entry = kv.save(tokens, bytes(range(256)) * 10)
    assert entry is not None
    data = bytearray(entry.path.read_bytes())
    if damage == "flip":
        data[-7] ^= 0xFF
    elif damage == "truncate":
        del data[-100:]
    elif damage == "magic":
        data[:8] = b"GGUFxxxx"
    entry.path.write_bytes(bytes(data))
    if damage == "foreign":  # a whole file, but in another model's folder
        other = store(tmp_path, key="f" * 32)
        other_entry = other.save(doc(MIN_SAVE, start=3), b"x")
        assert other_entry is not None
        os.replace(other_entry.path, entry.path)
    with caplog.at_level(logging.WARNING, logger="llmrun.kv"):
        found = kv.lookup(tokens)
        if found is not None:  # a flipped payload byte passes the header; the checksum catches it
            assert kv.load(found[0]) is None
    assert "KV cache: removed" in caplog.text
    assert not entry.path.exists()
    assert kv.lookup(tokens) is None


def test_the_store_stays_under_its_limit_least_recently_used_first(tmp_path: Path) -> None:
    kv = store(tmp_path, limit=3 * 1100 + 3 * (MIN_SAVE * 4 + 400))
    paths = []
    for i in range(3):
        entry = kv.save(doc(MIN_SAVE, start=i * 10_000), bytes(1000))
        assert entry is not None
        paths.append(entry.path)
        os.utime(entry.path, (1_000_000 + i, 1_000_000 + i))
    # the oldest is used again, so the second oldest goes when a fourth arrives
    found = kv.lookup(doc(MIN_SAVE, start=0))
    assert found is not None and kv.load(found[0]) is not None
    kv.save(doc(MIN_SAVE, start=99_000), bytes(1000))
    assert paths[0].exists() and not paths[1].exists() and paths[2].exists()
    assert sum(e.size for e in entries(kv.directory)) <= kv.limit


def test_a_payload_larger_than_the_whole_store_is_not_kept(tmp_path: Path) -> None:
    kv = store(tmp_path, limit=100)
    assert kv.save(doc(MIN_SAVE), bytes(1000)) is None
    assert not list(entries(kv.directory))


def test_the_model_key_changes_with_the_file_and_the_settings(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"one")
    first = model_key(model, {"kv_type": "f16"})
    assert model_key(model, {"kv_type": "f16"}) == first
    assert model_key(model, {"kv_type": "q8_0"}) != first
    model.write_bytes(b"two!")
    assert model_key(model, {"kv_type": "f16"}) != first


def test_remove_clears_every_model(tmp_path: Path) -> None:
    for key in ("a" * 32, "b" * 32):
        store(tmp_path, key).save(doc(MIN_SAVE), b"x" * 10)
    count, size = kv_store.remove(tmp_path / "kv")
    assert count == 2 and size > 0
    assert not list(entries(tmp_path / "kv"))


@pytest.mark.parametrize(
    ("text", "size"),
    [("4G", 4 * 1024**3), ("512M", 512 * 1024**2), ("1.5GiB", 3 * 1024**3 // 2), ("0", 0), ("100", 100)],
)
def test_sizes_read_as_people_write_them(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "-1G", "", "nanG", "infG"])
def test_a_size_that_is_not_one_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="not a size"):
        parse_size(text)
