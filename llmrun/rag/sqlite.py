"""The embedded vector store: one SQLite file per collection under ``<data dir>/rag/``.

A file's vectors are one float32 matrix (a blob in its ``files`` row), so a search reads one
row per file and does one exact matrix product over every chunk — a few milliseconds at
10,000 chunks — which is what a personal document set needs: no approximate index to build
or tune, no recall lost. Each file's chunks are replaced in one
transaction, so an interrupted ``index add`` leaves every file either fully old or fully new.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import StoreError, UsageError
from llmrun.rag.store import CollectionInfo, Hit, check_name

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from llmrun.rag.chunking import Chunk

SUFFIX = ".sqlite"
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, hash TEXT NOT NULL, chunks INTEGER NOT NULL, vectors BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    path TEXT NOT NULL, ord INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL,
    unit TEXT NOT NULL, hash TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (path, ord)
);
"""
_META_INT = ("dimension", "chunk_tokens", "overlap")


@contextmanager
def _errors(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.DatabaseError as exc:
        text = str(exc)
        if "disk is full" in text or "database or disk is full" in text:
            raise StoreError(
                f"the disk filled up while writing {path}", "free some space; nothing was half-written"
            ) from exc
        if "locked" in text:
            raise StoreError(f"{path} is in use by another llmrun", "wait for it to finish") from exc
        raise StoreError(
            f"{path} is not a readable collection: {text}", f"remove it: llmrun index rm {path.stem}"
        ) from exc


class SqliteCollection:
    def __init__(self, db: sqlite3.Connection, path: Path, info: CollectionInfo) -> None:
        self._db = db
        self.path = path
        self.info = info

    def file_hashes(self) -> dict[str, str]:
        with _errors(self.path):
            return dict(self._db.execute("SELECT path, hash FROM files").fetchall())

    def replace_file(
        self, path: str, file_hash: str, chunks: Sequence[Chunk], vectors: npt.NDArray[np.float32]
    ) -> None:
        import numpy as np

        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        rows = [(path, i, c.start, c.end, c.unit, c.hash, c.text) for i, c in enumerate(chunks)]
        matrix = np.ascontiguousarray(vectors, dtype=np.float32).tobytes()
        with _errors(self.path), self._db:
            self._db.execute("DELETE FROM chunks WHERE path = ?", (path,))
            self._db.executemany("INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?)", (path, file_hash, len(rows), matrix))

    def remove_files(self, paths: Sequence[str]) -> None:
        with _errors(self.path), self._db:
            for path in paths:
                self._db.execute("DELETE FROM chunks WHERE path = ?", (path,))
                self._db.execute("DELETE FROM files WHERE path = ?", (path,))

    def set_chunking(self, chunk_tokens: int, overlap: int) -> None:
        with _errors(self.path), self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [("chunk_tokens", str(chunk_tokens)), ("overlap", str(overlap))],
            )
        self.info = replace(self.info, chunk_tokens=chunk_tokens, overlap=overlap)

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[Hit]:
        import numpy as np

        with _errors(self.path):
            files = self._db.execute("SELECT path, chunks, vectors FROM files WHERE chunks > 0").fetchall()
            if not files:
                return []
            counts = np.array([row[1] for row in files])
            owner = np.repeat(np.arange(len(files)), counts)  # row → file
            order = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)  # row → ord
            matrix = np.frombuffer(b"".join(row[2] for row in files), dtype=np.float32)
            scores = matrix.reshape(len(owner), self.info.dimension) @ vector.astype(np.float32)
            k = min(k, len(owner))
            top = np.argpartition(-scores, k - 1)[:k]
            top = top[np.argsort(-scores[top], kind="stable")]
            hits = []
            for row in top:
                found = self._db.execute(
                    "SELECT text, path, start, end, unit FROM chunks WHERE path = ? AND ord = ?",
                    (files[owner[row]][0], int(order[row])),
                ).fetchone()
                hits.append(Hit(float(scores[row]), *found))
            return hits

    def close(self) -> None:
        self._db.close()


class SqliteStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.location = str(directory)

    def _path(self, name: str) -> Path:
        return self.directory / f"{check_name(name)}{SUFFIX}"

    def names(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(p.name.removesuffix(SUFFIX) for p in self.directory.glob(f"*{SUFFIX}") if p.is_file())

    def _connect(self, path: Path) -> sqlite3.Connection:
        with _errors(path):
            db = sqlite3.connect(path, timeout=10)
            db.execute("PRAGMA journal_mode = WAL")
            db.executescript(SCHEMA)
        return db

    def open(self, name: str) -> SqliteCollection | None:
        path = self._path(name)
        if not path.is_file():
            return None
        db = self._connect(path)
        with _errors(path):
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            files, chunks = db.execute("SELECT COUNT(*), COALESCE(SUM(chunks), 0) FROM files").fetchone()
        try:
            dimension, chunk_tokens, overlap = (int(meta[key]) for key in _META_INT)
            info = CollectionInfo(
                name, meta["embed_model"], meta["embed_path"], dimension, chunk_tokens, overlap, int(files), int(chunks)
            )
        except (KeyError, ValueError) as exc:
            db.close()
            raise StoreError(f"{path} lacks its settings ({exc})", f"remove it: llmrun index rm {name}") from exc
        return SqliteCollection(db, path, info)

    def create(self, info: CollectionInfo) -> SqliteCollection:
        path = self._path(info.name)
        if path.exists():
            raise UsageError(f"collection {info.name} already exists", "")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.directory}: {exc.strerror}", "check LLMRUN_HOME") from exc
        db = self._connect(path)
        values = {
            "embed_model": info.embed_model,
            "embed_path": info.embed_path,
            **{key: str(getattr(info, key)) for key in _META_INT},
        }
        with _errors(path), db:
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))
        return SqliteCollection(db, path, info)

    def remove(self, name: str) -> bool:
        path = self._path(name)
        if not path.exists():
            return False
        for extra in ("-wal", "-shm"):
            Path(f"{path}{extra}").unlink(missing_ok=True)
        path.unlink()
        return True
