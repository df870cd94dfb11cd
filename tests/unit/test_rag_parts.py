"""The pure parts of retrieval: chunking, the prompt budget, names, the embedded store."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from llmrun.errors import ContextFull, UsageError
from llmrun.rag.chunking import Chunk, blocks, chunk_lines, location
from llmrun.rag.context import build, ground
from llmrun.rag.documents import find, kind_of
from llmrun.rag.sqlite import SqliteStore
from llmrun.rag.store import CollectionInfo, Hit, check_name
from llmrun.rag.stores import open_store


def words(text: str) -> int:
    return len(text.split())


def numbered(text: str) -> list[tuple[int, str]]:
    return list(enumerate(text.split("\n"), start=1))


MARKDOWN = """# Title

Intro one two three.

## Section A

Alpha beta gamma delta epsilon zeta eta theta iota kappa.
Second line of A.

```python
def f():

    return 1
```

## Section B
""" + " ".join(f"w{i}." for i in range(60))


def test_markdown_blocks_keep_fences_whole_and_break_at_headings() -> None:
    found = blocks(numbered(MARKDOWN), "markdown")
    firsts = [block[0][1] for block in found]
    assert firsts[:5] == [
        "# Title",
        "Intro one two three.",
        "## Section A",
        "Alpha beta gamma delta epsilon zeta eta theta iota kappa.",
        "```python",
    ]
    fence = found[4]
    assert [n for n, _ in fence] == [10, 11, 12, 13, 14]  # the blank line inside the fence stays


def test_chunks_respect_the_size_and_cover_every_word() -> None:
    chunks = chunk_lines(numbered(MARKDOWN), words, max_tokens=20, overlap=0, kind="markdown")
    assert all(words(c.text) <= 20 for c in chunks)
    assert " ".join(c.text for c in chunks).split() == MARKDOWN.split()
    assert chunks[0].location == "lines 1-3" and chunks[0].text.startswith("# Title\n\nIntro")
    code = next(c for c in chunks if "def f" in c.text)
    assert (code.start, code.end) == (10, 14)


def test_overlap_repeats_the_tail_of_the_previous_chunk() -> None:
    text = " ".join(f"s{i}." for i in range(50))
    chunks = chunk_lines([(7, text)], words, max_tokens=10, overlap=3)
    assert all(c.start == c.end == 7 for c in chunks)
    for before, after in itertools.pairwise(chunks):
        assert before.text.split()[-3:] == after.text.split()[:3]
    with pytest.raises(ValueError):
        chunk_lines([(1, "x")], words, max_tokens=4)


def test_a_word_longer_than_a_chunk_is_cut() -> None:
    chunks = chunk_lines([(1, "x" * 400)], len, max_tokens=100, overlap=0)
    assert "".join(c.text for c in chunks) == "x" * 400 and all(len(c.text) <= 100 for c in chunks)


def test_locations_and_hashes() -> None:
    assert location(3, 3, "line") == "line 3" and location(2, 5, "page") == "pages 2-5"
    assert Chunk("a", 1, 1).hash != Chunk("b", 1, 1).hash and len(Chunk("a", 1, 1).hash) == 64


def hit(n: int, size: int) -> Hit:
    return Hit(1.0 - n / 10, " ".join(f"t{n}x{i}" for i in range(size)), f"/d/{n}.md", 1, 2, "line")


def test_context_keeps_what_fits_cuts_one_and_says_so() -> None:
    hits = [hit(i, 50) for i in range(5)]
    roomy = build("q?", hits, words, n_ctx=10_000, answer_tokens=100)
    assert len(roomy.used) == 5 and not roomy.trimmed and roomy.note() == ""
    assert "[1] /d/0.md:lines 1-2" in roomy.prompt and roomy.prompt.endswith("Question: q?")
    tight = build("q?", hits, words, n_ctx=64 + 100 + 30 + 120, answer_tokens=100)
    assert 1 <= len(tight.used) < 5 and tight.trimmed
    assert words(tight.prompt) <= 64 + 30 + 120  # the passages stay within their budget
    assert "passages used" in tight.note() and "`n_ctx`" in tight.note()
    none = build("q?", hits, words, n_ctx=100, answer_tokens=100)
    assert none.used == () and none.budget == 0
    with pytest.raises(ContextFull, match="leaves no room for the retrieved text"):
        ground("q?", hits, words, n_ctx=100, max_tokens=100)
    assert ground("q?", [], words, n_ctx=100, max_tokens=100).used == ()  # nothing retrieved: nothing refused
    assert ground("q?", hits, words, n_ctx=10_000, max_tokens=-1).used == tuple(hits)  # a quarter kept for the answer


def test_collection_names_cannot_reach_outside_the_store() -> None:
    for good in ("notes", "work-docs", "v1.2_x"):
        assert check_name(good) == good
    for bad in ("", "../x", "a/b", ".hidden", "a..b", "x" * 65, "with space", "C:\\x"):
        with pytest.raises(UsageError):
            check_name(bad)


def test_documents_are_found_and_binaries_skipped(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n", encoding="utf-8")
    (tmp_path / "b.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "c.bin").write_bytes(b"\0\1\2")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1") + b" " * 20)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n", encoding="utf-8")
    found, skipped = find([tmp_path])
    assert sorted(d.path.name for d in found) == ["a.md", "b.py"]
    assert sorted(s.path.name for s in skipped) == ["c.bin", "latin1.txt"]
    assert kind_of(Path("x.md")) == "markdown" and kind_of(Path("x.rs")) == "code" and kind_of(Path("x")) == "text"
    with pytest.raises(UsageError, match="no such file"):
        find([tmp_path / "missing"])
    with pytest.raises(UsageError, match="binary file"):
        find([tmp_path / "c.bin"])


def test_sqlite_store_replaces_files_atomically_and_searches_exactly(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "rag")
    collection = store.create(CollectionInfo("c", "m", "/m.gguf", 3, 256, 32))
    eye = np.eye(3, dtype=np.float32)
    collection.replace_file("/a", "h1", [Chunk("a1", 1, 1), Chunk("a2", 2, 2)], eye[:2])
    collection.replace_file("/b", "h2", [Chunk("b1", 1, 1)], eye[2:])
    with pytest.raises(ValueError):  # a failing write (vectors and chunks disagree) changes nothing
        collection.replace_file("/a", "h9", [Chunk("bad", 1, 1)], eye)
    assert collection.file_hashes() == {"/a": "h1", "/b": "h2"}
    hits = collection.search(np.array([0.1, 0.9, 0.0], dtype=np.float32), 2)
    assert [h.text for h in hits] == ["a2", "a1"] and hits[0].score == pytest.approx(0.9)
    collection.remove_files(["/a"])
    assert [h.text for h in collection.search(eye[0], 5)] == ["b1"]
    collection.close()
    reopened = store.open("c")
    assert reopened is not None and reopened.info.files == 1 and reopened.info.chunks == 1
    reopened.close()
    with pytest.raises(UsageError, match="already exists"):
        store.create(CollectionInfo("c", "m", "/m.gguf", 3, 256, 32))
    assert store.names() == ["c"] and store.remove("c") and store.names() == [] and not store.remove("c")


def test_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_store(f"sqlite://{tmp_path}"), SqliteStore)
    monkeypatch.setenv("LLMRUN_VECTOR_STORE", f"sqlite://{tmp_path}/env")
    assert open_store().location == f"{tmp_path}/env"
    from llmrun.rag.pgvector import PgvectorStore
    from llmrun.rag.qdrant import QdrantStore

    assert isinstance(open_store("postgresql://me:secret@db.example/docs"), PgvectorStore)
    assert open_store("postgresql://me:secret@db.example/docs").location == "postgresql://me@db.example/docs"
    assert isinstance(open_store(f"qdrant+local://{tmp_path}/q"), QdrantStore)
    with pytest.raises(UsageError, match="unknown vector store"):
        open_store("redis://localhost:6379")
