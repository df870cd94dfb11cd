"""The vector store contract, and choosing one from a URL.

A collection holds chunks (vector, text, source path, line range, content hash), the hash of
each indexed file (to re-embed only what changed) and what it was built with — embedding
model, dimension, chunk size — so a query or an update cannot mix models.

``--store`` (or ``LLMRUN_VECTOR_STORE``) picks the engine: nothing → the embedded store under
the data directory (SQLite, exact search, no server); ``postgresql://…`` → PostgreSQL with
pgvector; ``qdrant://HOST:PORT`` or ``qdrant+https://HOST`` → a Qdrant server;
``qdrant+local:///DIR`` → Qdrant's own embedded mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llmrun.errors import UsageError
from llmrun.files import SAFE_NAME

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from llmrun.rag.chunking import Chunk

STORE_ENV = "LLMRUN_VECTOR_STORE"


def check_name(name: str) -> str:
    """A collection name: letters, digits, '.', '_', '-' (it names a file), not starting with a dot."""
    if not SAFE_NAME.fullmatch(name) or ".." in name:
        raise UsageError(
            f"{name!r} is not a valid collection name",
            "use letters, digits, '.', '_' and '-' (up to 64, no slashes or '..'), e.g. notes or work-docs",
        )
    return name


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    name: str
    embed_model: str  # the name it was indexed with (what --embed-model said, or the default)
    embed_path: str  # the model file
    dimension: int
    chunk_tokens: int
    overlap: int
    files: int = 0
    chunks: int = 0


@dataclass(frozen=True, slots=True)
class Hit:
    score: float  # cosine similarity, -1 … 1
    text: str
    path: str
    start: int
    end: int
    unit: str

    @property
    def source(self) -> str:
        from llmrun.rag.chunking import location

        return f"{self.path}:{location(self.start, self.end, self.unit)}"


class Collection(Protocol):
    info: CollectionInfo

    def file_hashes(self) -> dict[str, str]: ...

    def replace_file(
        self, path: str, file_hash: str, chunks: Sequence[Chunk], vectors: npt.NDArray[np.float32]
    ) -> None: ...

    def remove_files(self, paths: Sequence[str]) -> None: ...

    def set_chunking(self, chunk_tokens: int, overlap: int) -> None: ...

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[Hit]: ...

    def close(self) -> None: ...


class VectorStore(Protocol):
    location: str  # for the user: a path or a URL

    def names(self) -> list[str]: ...

    def open(self, name: str) -> Collection | None: ...

    def create(self, info: CollectionInfo) -> Collection: ...

    def remove(self, name: str) -> bool: ...
