"""GGUF headers parsed once per file version, kept as small JSON files.

Parsing a header means walking every string of the vocabulary (262,144 for Gemma): about 50 ms
of Python on each ``run``, for the same answer every time. A header is kept under the llmrun home
(``cache/headers``), keyed by the file's resolved path and checked against its size, modification
time and inode, so a replaced or rewritten file is parsed again. A cache entry that cannot be read
(another version of llmrun, a damaged file) is parsed again and rewritten; a cache that cannot be
written (a read-only home) is skipped. Entries are written whole (a temporary file, then renamed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmrun.formats.gguf_header import ArraySummary, GgufHeader, TensorInfo

FORMAT = 1
_ARRAY = "$array"  # metadata values are never JSON objects, so an object is an ArraySummary


def cache_dir() -> Path:
    from llmrun.paths import home_dir

    return home_dir() / "cache" / "headers"


def cached_header(path: Path, read: Callable[[Path], GgufHeader], directory: Path | None = None) -> GgufHeader:
    """The header of the GGUF at ``path``: kept from an earlier parse of this very file, else ``read``."""
    resolved = path.resolve()
    try:
        stat = resolved.stat()
    except OSError:
        return read(path)  # read says what is wrong with the path
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    entry = (directory or cache_dir()) / (hashlib.sha256(str(resolved).encode()).hexdigest()[:32] + ".json")
    kept = _load(entry, str(resolved), stamp, path)
    if kept is not None:
        return kept
    header = read(path)
    _store(entry, {"format": FORMAT, "path": str(resolved), "stamp": stamp, "header": encode(header)})
    return header


def encode(header: GgufHeader) -> dict[str, Any]:
    return {
        "version": header.version,
        "metadata": {key: _value(value) for key, value in header.metadata.items()},
        "tensors": [[t.name, t.type_id, list(t.shape), t.offset, t.nbytes] for t in header.tensors],
        "data_offset": header.data_offset,
        "file_size": header.file_size,
    }


def decode(data: dict[str, Any], path: Path) -> GgufHeader:
    tensors = tuple(
        TensorInfo(str(name), int(type_id), tuple(int(d) for d in shape), int(offset), int(nbytes))
        for name, type_id, shape, offset, nbytes in data["tensors"]
    )
    metadata = {str(key): _restored(value) for key, value in data["metadata"].items()}
    return GgufHeader(path, int(data["version"]), metadata, tensors, int(data["data_offset"]), int(data["file_size"]))


def _value(value: Any) -> Any:
    if isinstance(value, ArraySummary):
        return {_ARRAY: [value.item_type, value.length]}
    if isinstance(value, list):
        return [_value(item) for item in value]
    return value


def _restored(value: Any) -> Any:
    if isinstance(value, dict):
        item_type, length = value[_ARRAY]
        return ArraySummary(int(item_type), int(length))
    if isinstance(value, list):
        return [_restored(item) for item in value]
    return value


def _load(entry: Path, resolved: str, stamp: list[int], path: Path) -> GgufHeader | None:
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or data.get("path") != resolved or data.get("stamp") != stamp:
            return None
        return decode(data["header"], path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _store(entry: Path, data: dict[str, Any]) -> None:
    with contextlib.suppress(OSError, ValueError):
        entry.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=entry.parent, prefix=".header-", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(data, out, separators=(",", ":"))
            os.replace(temporary, entry)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
