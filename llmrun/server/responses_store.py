"""The stored responses of ``/v1/responses`` (``store: true``, OpenAI's default): one JSON file each under
``<llmrun home>/responses/``, written whole (a temporary file and a rename), bounded by count and by bytes —
the oldest go first. A client's id becomes a file name only when it is one this store makes
(``resp_`` and 24 hex digits); any other id is simply not found. Reads and writes block: the routes call
them off the event loop."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from llmrun.files import atomic_write_text

IDENT = re.compile(r"resp_[0-9a-f]{24}")
MAX_COUNT = 1_000
MAX_BYTES = 256 * 1024 * 1024


class ResponseStore:
    def __init__(self, directory: Path, max_count: int = MAX_COUNT, max_bytes: int = MAX_BYTES) -> None:
        self.directory = directory
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _path(self, ident: str) -> Path | None:
        return self.directory / f"{ident}.json" if IDENT.fullmatch(ident) else None

    def save(self, ident: str, record: dict[str, Any]) -> None:
        path = self._path(ident)
        if path is None:
            raise ValueError(f"not a response id: {ident!r}")
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode("utf-8")) > self.max_bytes:
            return  # larger than the whole store: not kept (a later previous_response_id is a 404)
        with self._lock:
            atomic_write_text(path, text)
            self._evict()

    def load(self, ident: str) -> dict[str, Any] | None:
        path = self._path(ident)
        if path is None:
            return None
        try:
            record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record

    def delete(self, ident: str) -> bool:
        path = self._path(ident)
        if path is None:
            return False
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        return True

    def _evict(self) -> None:
        """The oldest responses removed until the store is within its count and bytes."""
        files = []
        for path in self.directory.glob("resp_*.json"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            files.append((stat.st_mtime_ns, path.name, stat.st_size, path))
        files.sort()
        total = sum(size for _, _, size, _ in files)
        while files and (len(files) > self.max_count or total > self.max_bytes):
            _, _, size, path = files.pop(0)
            path.unlink(missing_ok=True)
            total -= size
