"""The Qdrant adapter, through qdrant-client: a Qdrant server (``qdrant://HOST:6333``,
``qdrant+https://HOST``; ``QDRANT_API_KEY`` for a key) or Qdrant's embedded mode
(``qdrant+local:///DIR``).

Each collection is a Qdrant collection with cosine distance; its settings are the collection's
metadata, each chunk a point whose payload carries its text, source, line range, content hash
and the hash of its file. A file's new chunks are written before its old ones are deleted, so
an interruption leaves its old or both versions (then the next ``index add`` re-embeds it),
never neither.
"""

from __future__ import annotations

import os
import uuid
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

BATCH = 256
_SETTINGS = ("embed_model", "embed_path", "dimension", "chunk_tokens", "overlap")


@contextmanager
def _errors(where: str) -> Iterator[None]:
    try:
        yield
    except (UsageError, StoreError):
        raise
    except Exception as exc:  # qdrant-client raises httpx, grpc and its own errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"Qdrant at {where}: {first}", "is the server running and the URL right?") from exc


def _path_filter(path: str) -> Any:
    from qdrant_client import models

    return models.Filter(must=[models.FieldCondition(key="path", match=models.MatchValue(value=path))])


class QdrantCollection:
    def __init__(self, client: Any, where: str, info: CollectionInfo) -> None:
        self._client = client
        self._where = where
        self.info = info

    def _points(self, fields: list[str]) -> Iterator[dict[str, Any]]:
        offset = None
        while True:
            points, offset = self._client.scroll(
                self.info.name, limit=1024, offset=offset, with_payload=fields, with_vectors=False
            )
            for point in points:
                yield point.payload or {}
            if offset is None:
                return

    def file_hashes(self) -> dict[str, str]:
        seen: dict[str, set[str]] = {}
        with _errors(self._where):
            for payload in self._points(["path", "file_hash"]):
                seen.setdefault(str(payload.get("path")), set()).add(str(payload.get("file_hash")))
        return {path: next(iter(hashes)) for path, hashes in seen.items() if len(hashes) == 1}

    def replace_file(
        self, path: str, file_hash: str, chunks: Sequence[Chunk], vectors: npt.NDArray[np.float32]
    ) -> None:
        from qdrant_client import models

        points = [
            models.PointStruct(
                id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{path}\0{file_hash}\0{i}")),
                vector=[float(x) for x in vector],
                payload={
                    "path": path,
                    "file_hash": file_hash,
                    "start": c.start,
                    "end": c.end,
                    "unit": c.unit,
                    "hash": c.hash,
                    "text": c.text,
                },
            )
            for i, (c, vector) in enumerate(zip(chunks, vectors, strict=True))
        ]
        with _errors(self._where):
            for begin in range(0, len(points), BATCH):
                self._client.upsert(self.info.name, points=points[begin : begin + BATCH], wait=True)
            stale = models.Filter(
                must=[models.FieldCondition(key="path", match=models.MatchValue(value=path))],
                must_not=[models.FieldCondition(key="file_hash", match=models.MatchValue(value=file_hash))],
            )
            self._client.delete(self.info.name, points_selector=models.FilterSelector(filter=stale), wait=True)

    def remove_files(self, paths: Sequence[str]) -> None:
        from qdrant_client import models

        with _errors(self._where):
            for path in paths:
                selector = models.FilterSelector(filter=_path_filter(path))
                self._client.delete(self.info.name, points_selector=selector, wait=True)

    def set_chunking(self, chunk_tokens: int, overlap: int) -> None:
        with _errors(self._where):
            self._client.update_collection(self.info.name, metadata={"chunk_tokens": chunk_tokens, "overlap": overlap})
        self.info = replace(self.info, chunk_tokens=chunk_tokens, overlap=overlap)

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[Hit]:
        with _errors(self._where):
            found = self._client.query_points(
                self.info.name, query=[float(x) for x in vector], limit=k, with_payload=True
            ).points
        return [
            Hit(
                float(p.score),
                p.payload["text"],
                p.payload["path"],
                p.payload["start"],
                p.payload["end"],
                p.payload["unit"],
            )
            for p in found
        ]

    def close(self) -> None:
        pass


class QdrantStore:
    def __init__(self, client: Any, location: str, local: bool = False) -> None:
        self._client = client
        self.location = location
        self._local = local  # Qdrant's embedded mode, which has no payload indexes

    @classmethod
    def from_url(cls, url: str) -> QdrantStore:
        try:
            from qdrant_client import QdrantClient
        except ImportError as exc:
            raise UsageError("the Qdrant store needs qdrant-client", "pip install 'llmrun[qdrant]'") from exc
        scheme, _, rest = url.partition("://")
        with _errors(url):
            if scheme == "qdrant+local":
                client = QdrantClient(path=rest or ".")
            else:
                http = "https" if scheme == "qdrant+https" else "http"
                client = QdrantClient(url=f"{http}://{rest}", api_key=os.environ.get("QDRANT_API_KEY") or None)
        return cls(client, url, local=scheme == "qdrant+local")

    def names(self) -> list[str]:
        with _errors(self.location):
            return sorted(c.name for c in self._client.get_collections().collections)

    def open(self, name: str) -> QdrantCollection | None:
        check_name(name)
        with _errors(self.location):
            if not self._client.collection_exists(name):
                return None
            described = self._client.get_collection(name)
            meta = dict(getattr(described.config, "metadata", None) or {})
            count = self._client.count(name, exact=True).count
        if any(key not in meta for key in _SETTINGS):
            raise StoreError(f"Qdrant collection {name} was not made by llmrun", "choose another name")
        info = CollectionInfo(
            name,
            str(meta["embed_model"]),
            str(meta["embed_path"]),
            int(meta["dimension"]),
            int(meta["chunk_tokens"]),
            int(meta["overlap"]),
            chunks=int(count),
        )
        collection = QdrantCollection(self._client, self.location, info)
        collection.info = replace(info, files=len(collection.file_hashes()))
        return collection

    def create(self, info: CollectionInfo) -> QdrantCollection:
        from qdrant_client import models

        check_name(info.name)
        with _errors(self.location):
            self._client.create_collection(
                info.name,
                vectors_config=models.VectorParams(size=info.dimension, distance=models.Distance.COSINE),
                metadata={key: getattr(info, key) for key in _SETTINGS},
            )
            if not self._local:  # deleting a file's chunks filters on its path
                self._client.create_payload_index(info.name, "path", models.PayloadSchemaType.KEYWORD)
        return QdrantCollection(self._client, self.location, info)

    def remove(self, name: str) -> bool:
        check_name(name)
        with _errors(self.location):
            if not self._client.collection_exists(name):
                return False
            self._client.delete_collection(name)
        return True
