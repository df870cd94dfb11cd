"""The PostgreSQL + pgvector adapter, through psycopg and pgvector-python:
``postgresql://USER:PASSWORD@HOST:5432/DB`` (any libpq URL).

Collections are rows of ``llmrun_collections``; each collection's chunks live in their own
table with a ``vector(DIM)`` column and an HNSW index for cosine distance, file hashes in
``llmrun_files``. A file's chunks and its hash change in one transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llmrun.errors import StoreError, UsageError
from llmrun.rag.store import CollectionInfo, Hit, check_name

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from llmrun.rag.chunking import Chunk

SCHEMA = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE IF NOT EXISTS llmrun_collections (
    name text PRIMARY KEY, embed_model text NOT NULL, embed_path text NOT NULL,
    dimension integer NOT NULL, chunk_tokens integer NOT NULL, overlap integer NOT NULL
);
CREATE TABLE IF NOT EXISTS llmrun_files (
    collection text NOT NULL REFERENCES llmrun_collections (name) ON DELETE CASCADE,
    path text NOT NULL, hash text NOT NULL, chunks integer NOT NULL, PRIMARY KEY (collection, path)
);
"""


def table(name: str) -> str:
    """A collection's chunk table: a fixed-length name whatever the collection is called."""
    return "llmrun_chunks_" + hashlib.sha256(name.encode()).hexdigest()[:16]


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{credentials.split(':')[0]}@{host}" if at else url


@contextmanager
def _errors(where: str) -> Iterator[None]:
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"PostgreSQL at {where}: {first}", "is the server running, and the URL right?") from exc


class PgvectorCollection:
    def __init__(self, db: Any, where: str, info: CollectionInfo) -> None:
        self._db = db
        self._where = where
        self._table = table(info.name)
        self.info = info

    def file_hashes(self) -> dict[str, str]:
        with _errors(self._where), self._db.transaction():
            rows = self._db.execute(
                "SELECT path, hash FROM llmrun_files WHERE collection = %s", (self.info.name,)
            ).fetchall()
        return dict(rows)

    def replace_file(
        self, path: str, file_hash: str, chunks: Sequence[Chunk], vectors: npt.NDArray[np.float32]
    ) -> None:
        import numpy as np

        rows = [
            (path, c.start, c.end, c.unit, c.hash, c.text, np.asarray(v, dtype=np.float32))
            for c, v in zip(chunks, vectors, strict=True)
        ]
        with _errors(self._where), self._db.transaction():
            self._db.execute(f"DELETE FROM {self._table} WHERE path = %s", (path,))
            with self._db.cursor() as cursor:
                cursor.executemany(
                    f'INSERT INTO {self._table} (path, start, "end", unit, hash, text, embedding) '
                    "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    rows,
                )
            self._db.execute(
                "INSERT INTO llmrun_files VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (collection, path) DO UPDATE SET hash = EXCLUDED.hash, chunks = EXCLUDED.chunks",
                (self.info.name, path, file_hash, len(rows)),
            )

    def remove_files(self, paths: Sequence[str]) -> None:
        with _errors(self._where), self._db.transaction():
            for path in paths:
                self._db.execute(f"DELETE FROM {self._table} WHERE path = %s", (path,))
                self._db.execute("DELETE FROM llmrun_files WHERE collection = %s AND path = %s", (self.info.name, path))

    def set_chunking(self, chunk_tokens: int, overlap: int) -> None:
        with _errors(self._where), self._db.transaction():
            self._db.execute(
                "UPDATE llmrun_collections SET chunk_tokens = %s, overlap = %s WHERE name = %s",
                (chunk_tokens, overlap, self.info.name),
            )
        self.info = replace(self.info, chunk_tokens=chunk_tokens, overlap=overlap)

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[Hit]:
        import numpy as np

        query = np.asarray(vector, dtype=np.float32)
        with _errors(self._where), self._db.transaction():
            self._db.execute(f"SET LOCAL hnsw.ef_search = {max(40, 2 * int(k))}")
            rows = self._db.execute(
                f'SELECT 1 - (embedding <=> %s), text, path, start, "end", unit FROM {self._table} '
                "ORDER BY embedding <=> %s LIMIT %s",
                (query, query, k),
            ).fetchall()
        return [Hit(float(row[0]), *row[1:]) for row in rows]

    def close(self) -> None:
        self._db.close()


class PgvectorStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.location = _redacted(url)

    def _connect(self) -> Any:
        try:
            import psycopg
            from pgvector.psycopg import register_vector
        except ImportError as exc:
            raise UsageError(
                "the PostgreSQL store needs psycopg and pgvector", "pip install 'llmrun[pgvector]'"
            ) from exc
        with _errors(self.location):
            db = psycopg.connect(self.url, connect_timeout=10)
            with db.transaction():
                db.execute(SCHEMA)
            register_vector(db)
        return db

    def names(self) -> list[str]:
        db = self._connect()
        try:
            with _errors(self.location):
                return [row[0] for row in db.execute("SELECT name FROM llmrun_collections ORDER BY name").fetchall()]
        finally:
            db.close()

    def open(self, name: str) -> PgvectorCollection | None:
        check_name(name)
        db = self._connect()
        with _errors(self.location), db.transaction():
            row = db.execute(
                "SELECT embed_model, embed_path, dimension, chunk_tokens, overlap FROM llmrun_collections "
                "WHERE name = %s",
                (name,),
            ).fetchone()
            counts = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(chunks), 0) FROM llmrun_files WHERE collection = %s", (name,)
            ).fetchone()
        if row is None:
            db.close()
            return None
        model, path, dimension, chunk_tokens, overlap = row
        info = CollectionInfo(name, model, path, dimension, chunk_tokens, overlap, int(counts[0]), int(counts[1]))
        return PgvectorCollection(db, self.location, info)

    def create(self, info: CollectionInfo) -> PgvectorCollection:
        check_name(info.name)
        db = self._connect()
        chunks = table(info.name)
        with _errors(self.location), db.transaction():
            exists = db.execute("SELECT 1 FROM llmrun_collections WHERE name = %s", (info.name,)).fetchone()
            if exists:
                db.close()
                raise UsageError(f"collection {info.name} already exists", "")
            db.execute(
                "INSERT INTO llmrun_collections VALUES (%s, %s, %s, %s, %s, %s)",
                (info.name, info.embed_model, info.embed_path, info.dimension, info.chunk_tokens, info.overlap),
            )
            db.execute(
                f"CREATE TABLE {chunks} (id bigserial PRIMARY KEY, path text NOT NULL, start integer NOT NULL, "
                '"end" integer NOT NULL, unit text NOT NULL, hash text NOT NULL, text text NOT NULL, '
                f"embedding vector({int(info.dimension)}) NOT NULL)"
            )
            db.execute(f"CREATE INDEX ON {chunks} (path)")
            db.execute(f"CREATE INDEX ON {chunks} USING hnsw (embedding vector_cosine_ops)")
        return PgvectorCollection(db, self.location, info)

    def remove(self, name: str) -> bool:
        check_name(name)
        db = self._connect()
        try:
            with _errors(self.location), db.transaction():
                gone = db.execute("DELETE FROM llmrun_collections WHERE name = %s RETURNING name", (name,)).fetchone()
                db.execute(f"DROP TABLE IF EXISTS {table(name)}")
            return gone is not None
        finally:
            db.close()
