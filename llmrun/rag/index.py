"""Building and querying a collection: find documents, re-embed what changed, search."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import UsageError
from llmrun.rag.chunking import Chunk, chunk_lines
from llmrun.rag.documents import Document, Skipped, file_hash, find, read_lines
from llmrun.rag.store import Collection, CollectionInfo, Hit, VectorStore, check_name

if TYPE_CHECKING:
    from llmrun.backends.base import Embedder
    from llmrun.store import Progress

EMBED_BATCH = 32  # chunks per embedding call (progress moves between calls)


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
            f"leave out --embed-model (or pass {info.embed_model}), or index into a new collection",
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
    import numpy as np

    check_name(name)
    if overlap >= chunk_tokens:
        raise UsageError(f"--overlap {overlap} must be smaller than --chunk-tokens {chunk_tokens}", "")
    started = time.perf_counter()
    step = progress or (lambda what, done, total: None)
    documents, skipped = find(paths)
    collection = store.open(name)
    if collection is not None and model is not None:
        check_same_model(collection.info, model)
    chosen = model or default_model(collection.info.embed_model if collection else "")
    embedder = chosen.open()
    try:
        if chunk_tokens > embedder.max_tokens:
            raise UsageError(
                f"--chunk-tokens {chunk_tokens} is more than {chosen.name} reads at once ({embedder.max_tokens})",
                f"use --chunk-tokens {min(256, embedder.max_tokens)} or less",
            )
        if collection is not None and embedder.dimension != collection.info.dimension:
            raise UsageError(
                f"{chosen.name} makes {embedder.dimension}-dimension vectors; "
                f"collection {name} holds {collection.info.dimension}",
                "index into a new collection",
            )
        report = AddReport(name, chosen.name, embedder.dimension, skipped=skipped, created=collection is None)
        if collection is None:
            collection = store.create(
                CollectionInfo(name, chosen.name, str(chosen.path), embedder.dimension, chunk_tokens, overlap)
            )
        try:
            rechunk = (collection.info.chunk_tokens, collection.info.overlap) != (chunk_tokens, overlap)
            indexed = collection.file_hashes()
            known = {} if rechunk else indexed
            present = {str(d.path) for d in documents}
            roots = [p.absolute() for p in paths]
            report.removed = sorted(p for p in indexed if _under(p, roots) and p not in present)
            collection.remove_files(report.removed)
            work: list[tuple[Document, str, list[Chunk]]] = []
            for number, document in enumerate(documents, start=1):
                step("read files", number, len(documents))
                digest = file_hash(document.path)
                if known.get(str(document.path)) == digest:
                    report.unchanged += 1
                    continue
                lines = read_lines(document)
                chunks = chunk_lines(lines, embedder.count, chunk_tokens, overlap, document.kind, document.unit)
                work.append((document, digest, chunks))
            total = sum(len(chunks) for _, _, chunks in work)
            embed_started = time.perf_counter()
            for document, digest, chunks in work:
                vectors = []
                for begin in range(0, len(chunks), EMBED_BATCH):
                    vectors.append(embedder.embed([c.text for c in chunks[begin : begin + EMBED_BATCH]]))
                    report.chunks += len(chunks[begin : begin + EMBED_BATCH])
                    step("embed chunks", report.chunks, total)
                matrix = np.concatenate(vectors) if vectors else np.zeros((0, embedder.dimension), np.float32)
                collection.replace_file(str(document.path), digest, chunks, matrix)
                report.indexed.append(str(document.path))
            report.embed_seconds = time.perf_counter() - embed_started
            if rechunk:
                collection.set_chunking(chunk_tokens, overlap)
        finally:
            collection.close()
    finally:
        embedder.close()
    report.seconds = time.perf_counter() - started
    return report


def _existing(store: VectorStore, name: str) -> Collection:
    check_name(name)
    collection = store.open(name)
    if collection is None:
        known = store.names()
        raise UsageError(
            f"no collection named {name!r}",
            f"collections: {', '.join(known)}" if known else f"create one: llmrun index add DOCS -c {name}",
        )
    return collection


def query(
    store: VectorStore, name: str, text: str, k: int, default_model: Callable[[str], EmbeddingModel]
) -> tuple[CollectionInfo, list[Hit]]:
    """The ``k`` chunks of collection ``name`` nearest to ``text``, best first."""
    if not text.strip():
        raise UsageError("no query text given", 'llmrun index query NAME "what to look for"')
    if k < 1:
        raise UsageError(f"-k must be at least 1, got {k}", "")
    collection = _existing(store, name)
    try:
        if collection.info.chunks == 0:
            raise UsageError(f"collection {name} is empty", f"add documents: llmrun index add DOCS -c {name}")
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
    from llmrun.rag.store import open_store

    store = open_store(store_url)
    collection = _existing(store, name)
    info = collection.info
    collection.close()
    if info.chunks == 0:
        raise UsageError(f"collection {name} is empty", f"add documents: llmrun index add DOCS -c {name}")
    return info
