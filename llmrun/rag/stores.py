"""Vector stores by URL: the embedded SQLite store, Qdrant, PostgreSQL with pgvector (each imported only when named)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import UsageError
from llmrun.rag.store import STORE_ENV, VectorStore

if TYPE_CHECKING:
    pass


def open_store(url: str | None = None) -> VectorStore:
    """The store ``url`` names; the embedded one when it names none."""
    url = url or os.environ.get(STORE_ENV) or ""
    if not url:
        from llmrun.paths import home_dir
        from llmrun.rag.sqlite import SqliteStore

        return SqliteStore(home_dir() / "rag")
    if url.startswith(("qdrant://", "qdrant+http://", "qdrant+https://", "qdrant+local://")):
        from llmrun.rag.qdrant import QdrantStore

        return QdrantStore.from_url(url)
    if url.startswith(("postgresql://", "postgres://")):
        from llmrun.rag.pgvector import PgvectorStore

        return PgvectorStore(url)
    if url.startswith("sqlite://"):
        from llmrun.rag.sqlite import SqliteStore

        return SqliteStore(Path(url.removeprefix("sqlite://")).expanduser())
    raise UsageError(
        f"unknown vector store {url!r}",
        "use postgresql://USER@HOST/DB, qdrant://HOST:6333, qdrant+https://HOST, qdrant+local:///DIR "
        "or sqlite:///DIR (default: the embedded store)",
    )
