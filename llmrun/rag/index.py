"""Building and querying a collection: find documents, re-embed what changed, search."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import UsageError
from llmrun.files import sha256_file
from llmrun.rag.chunking import Chunk, chunk_lines
from llmrun.rag.documents import Document, Skipped, find, read_lines
from llmrun.rag.store import Collection, CollectionInfo, Hit, VectorStore, check_name

if TYPE_CHECKING:
    from llmrun.backends.base import Embedder
    from llmrun.files import Progress

EMBED_BATCH = 64  # chunks per embedding call (progress moves, and finished files are stored, between calls)


@dataclass(frozen=True, slots=True)
class EmbeddingModel:
    name: str  # as the user named it (or the default)
    path: Path
    open: Callable[[], Embedder]


@dataclass(slots=True)
class AddReport:
    collection: str
    embed_model: str
    dimension: int
    indexed: list[str] = field(default_factory=list)  # new or changed files, embedded now
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)  # files gone from disk, chunks dropped
    skipped: list[Skipped] = field(default_factory=list)
    chunks: int = 0  # chunks embedded now
    embed_seconds: float = 0.0
    seconds: float = 0.0
    created: bool = False

    @property
    def chunks_per_second(self) -> float:
        return self.chunks / self.embed_seconds if self.embed_seconds > 0 else 0.0


def _under(path: str, roots: Sequence[Path]) -> bool:
    return any(path == str(root) or path.startswith(str(root).rstrip(os.sep) + os.sep) for root in roots)


def check_same_model(info: CollectionInfo, model: EmbeddingModel) -> None:
    if model.name != info.embed_model and str(model.path) != info.embed_path:
        raise UsageError(
            f"collection {info.name} was built with {info.embed_model} ({info.dimension} dimensions), not {model.name}",
            f"leave out `embed_model` (or pass {info.embed_model}), or index into a new collection",
        )


def add(
    store: VectorStore,
    name: str,
    paths: Sequence[Path],
    model: EmbeddingModel | None,
    default_model: Callable[[str], EmbeddingModel],
    chunk_tokens: int,
    overlap: int,
    progress: Progress | None = None,
) -> AddReport:
    """Index ``paths`` into collection ``name``: embed new and changed files, drop deleted ones.

    ``model`` is what --embed-model named; ``None`` means the collection's own, or for a new
    collection ``default_model("")`` (``default_model(name)`` reopens a recorded name)."""
    check_name(name)
    if overlap >= chunk_tokens:
        raise UsageError(f"`overlap` {overlap} must be smaller than `chunk_tokens` {chunk_tokens}", "")
    started = time.perf_counter()
    documents, skipped = find(paths)
    collection = store.open(name)
    try:
        if collection is not None and model is not None:
            check_same_model(collection.info, model)
        chosen = model or default_model(collection.info.embed_model if collection else "")
        embedder = chosen.open()
        try:
            _check_fit(embedder, chosen.name, collection.info if collection else None, chunk_tokens)
            report = AddReport(name, chosen.name, embedder.dimension, skipped=skipped, created=collection is None)
            if collection is None:
                info = CollectionInfo(name, chosen.name, str(chosen.path), embedder.dimension, chunk_tokens, overlap)
                collection = store.create(info)
            _update(collection, embedder, documents, paths, (chunk_tokens, overlap), report, progress)
        finally:
            embedder.close()
    finally:
        if collection is not None:
            collection.close()
    report.seconds = time.perf_counter() - started
    return report


def _check_fit(embedder: Embedder, model: str, info: CollectionInfo | None, chunk_tokens: int) -> None:
    if chunk_tokens > embedder.max_tokens:
        raise UsageError(
            f"`chunk_tokens` {chunk_tokens} is more than {model} reads at once ({embedder.max_tokens})",
            f"use `chunk_tokens` {min(256, embedder.max_tokens)} or less",
        )
    if info is not None and embedder.dimension != info.dimension:
        raise UsageError(
            f"{model} makes {embedder.dimension}-dimension vectors; collection {info.name} holds {info.dimension}",
            "index into a new collection",
        )


def _update(
    collection: Collection,
    embedder: Embedder,
    documents: Sequence[Document],
    paths: Sequence[Path],
    chunking: tuple[int, int],
    report: AddReport,
    progress: Progress | None,
) -> None:
    """Drop deleted files, then chunk and embed new and changed ones, one file per store write."""
    import numpy as np

    step = progress or (lambda what, done, total: None)
    rechunk = (collection.info.chunk_tokens, collection.info.overlap) != chunking
    indexed = collection.file_hashes()
    known = {} if rechunk else indexed
    present = {str(d.path) for d in documents}
    roots = [p.absolute() for p in paths]
    report.removed = sorted(p for p in indexed if _under(p, roots) and p not in present)
    collection.remove_files(report.removed)
    work: list[tuple[Document, str, list[Chunk]]] = []
    for number, document in enumerate(documents, start=1):
        step("read files", number, len(documents))
        digest = sha256_file(document.path)
        if known.get(str(document.path)) == digest:
            report.unchanged += 1
            continue
        chunks = chunk_lines(read_lines(document), embedder.count, *chunking, document.kind, document.unit)
        work.append((document, digest, chunks))
    texts = [chunk.text for _, _, chunks in work for chunk in chunks]
    vectors = np.zeros((len(texts), embedder.dimension), np.float32)
    embed_started = time.perf_counter()
    written = 0  # files stored so far; a file is stored as soon as all its chunks are embedded
    ends = np.cumsum([len(chunks) for _, _, chunks in work])
    for begin in range(0, len(texts), EMBED_BATCH):  # batches span files, so llama.cpp's batches stay full
        vectors[begin : begin + EMBED_BATCH] = embedder.embed(texts[begin : begin + EMBED_BATCH])
        report.chunks = min(begin + EMBED_BATCH, len(texts))
        step("embed chunks", report.chunks, len(texts))
        while written < len(work) and ends[written] <= report.chunks:
            document, digest, chunks = work[written]
            collection.replace_file(
                str(document.path), digest, chunks, vectors[ends[written] - len(chunks) : ends[written]]
            )
            report.indexed.append(str(document.path))
            written += 1
    for document, digest, chunks in work[written:]:  # files with no chunks (empty)
        collection.replace_file(str(document.path), digest, chunks, vectors[:0])
        report.indexed.append(str(document.path))
    report.embed_seconds = time.perf_counter() - embed_started
    if rechunk:
        collection.set_chunking(*chunking)


def _searchable(store: VectorStore, name: str) -> Collection:
    """Collection ``name``, open; a clear error when it does not exist or holds no chunks."""
    check_name(name)
    collection = store.open(name)
    if collection is None:
        known = store.names()
        raise UsageError(
            f"no collection named {name!r}",
            f"collections: {', '.join(known)}" if known else f"create one: llmrun index add DOCS -c {name}",
        )
    if collection.info.chunks == 0:
        collection.close()
        raise UsageError(f"collection {name} is empty", f"add documents: llmrun index add DOCS -c {name}")
    return collection


def query(
    store: VectorStore, name: str, text: str, k: int, default_model: Callable[[str], EmbeddingModel]
) -> tuple[CollectionInfo, list[Hit]]:
    """The ``k`` chunks of collection ``name`` nearest to ``text``, best first."""
    if not text.strip():
        raise UsageError("no query text given", 'llmrun index query NAME "what to look for"')
    if k < 1:
        raise UsageError(f"-k must be at least 1, got {k}", "")
    collection = _searchable(store, name)
    try:
        embedder = default_model(collection.info.embed_model).open()
        try:
            vector = embedder.embed([text])[0]
        finally:
            embedder.close()
        if vector.shape[0] != collection.info.dimension:
            raise UsageError(
                f"{collection.info.embed_model} now makes {vector.shape[0]}-dimension vectors; "
                f"collection {name} holds {collection.info.dimension}",
                f"re-index: llmrun index rm {name}, then llmrun index add",
            )
        return collection.info, collection.search(vector, k)
    finally:
        collection.close()


def open_collection(store_url: str | None, name: str) -> CollectionInfo:
    """Collection ``name``'s settings and counts; a clear error when it does not exist or is empty."""
    from llmrun.rag.stores import open_store

    collection = _searchable(open_store(store_url), name)
    collection.close()
    return collection.info
