"""The KV store: a model's KV cells for a token prefix, kept on disk so a later process skips its prefill.

Content-addressed: a directory per *model key* (the model file's identity and the load settings
that change the numbers in the cells, :func:`model_key`), a file per token prefix, named by the
sha256 of its tokens. A file is a header (magic, JSON: key, token count, payload size, checksum),
the tokens (int32) and the backend's own serialisation of the cells (llama.cpp's sequence state,
mlx-lm's prompt cache). Lookup is by longest common prefix with the new prompt; a hit touches the
file, and the store stays under its size by removing the least recently used files.

Files land whole (a temporary file, then renamed); a file that is damaged, truncated or made for
another model is removed with a warning on the ``llmrun.kv`` logger and never handed to a backend.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from llmrun.decoding.tokens import common_prefix
from llmrun.files import PARTIAL_PREFIX, atomic_output, clean_partials

MAGIC = b"LLMRUNKV"
FORMAT = 1
SUFFIX = ".kv"
DEFAULT_LIMIT = 4 * 1024**3  # bytes over every model's files
MIN_SAVE = 256  # a prefix this short costs little to evaluate again: not kept
MIN_REUSE = 32  # a hit must spare at least this many tokens
HASH_CHUNK = 2 * 1024 * 1024  # the payload's checksum is over the sha256 of each chunk this long
_MAX_HEADER = 64 * 1024
_log = logging.getLogger("llmrun.kv")


def store_dir() -> Path:
    from llmrun.paths import home_dir

    return home_dir() / "cache" / "kv"


def model_key(path: Path, settings: Mapping[str, Any]) -> str:
    """The model file (resolved path, size, modification time, inode: the header cache's stamp) and
    the load ``settings`` that change the cells (backend, KV type, flash attention, the engine's version)."""
    resolved = path.resolve()
    stat = resolved.stat()
    identity = {
        "path": str(resolved),
        "stamp": [stat.st_size, stat.st_mtime_ns, stat.st_ino],
        "settings": dict(sorted(settings.items())),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def tokens_digest(tokens: Sequence[int]) -> str:
    return hashlib.sha256(_token_bytes(tokens)).hexdigest()


def _token_bytes(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One kept prefix: where it is, what it holds and for which model."""

    path: Path
    key: str
    tokens: tuple[int, ...]
    payload_size: int
    checksum: str  # sha256 of the tokens and of the payload's chunks (see :func:`checksum`)
    created: float
    label: Mapping[str, Any]  # for people: the model's name, backend, KV type

    @property
    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    @property
    def used(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0

    @property
    def payload_offset(self) -> int:
        return self.path.stat().st_size - self.payload_size


class Damaged(Exception):
    """A file that is not a whole, checked KV entry."""


def read_entry(path: Path) -> KvEntry:
    """The header and tokens of the file at ``path`` (the payload is read by :func:`read_payload`)."""
    with path.open("rb") as handle:
        return _read_head(handle, path)


def _read_head(handle: BinaryIO, path: Path) -> KvEntry:
    start = handle.read(len(MAGIC) + 4)
    if len(start) != len(MAGIC) + 4 or not start.startswith(MAGIC):
        raise Damaged("not a KV file")
    (length,) = struct.unpack("<I", start[len(MAGIC) :])
    if length > _MAX_HEADER:
        raise Damaged("header too long")
    try:
        head = json.loads(handle.read(length))
        n_tokens, payload_size = int(head["tokens"]), int(head["payload"])
        if head.get("format") != FORMAT or n_tokens < 0 or payload_size < 0:
            raise Damaged(f"format {head.get('format')!r}")
        raw = handle.read(4 * n_tokens)
        if len(raw) != 4 * n_tokens:
            raise Damaged("truncated tokens")
        tokens = struct.unpack(f"<{n_tokens}i", raw)
        size = os.fstat(handle.fileno()).st_size
        if size != len(MAGIC) + 4 + length + 4 * n_tokens + payload_size:
            raise Damaged(f"{size} bytes, not what the header says")
        return KvEntry(
            path, str(head["key"]), tokens, payload_size, str(head["sha256"]), float(head["created"]), head["label"]
        )
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise Damaged(f"bad header: {exc}") from None


def checksum(tokens: Sequence[int], chunk_digests: Sequence[bytes]) -> str:
    """sha256 over the tokens and the sha256 of each :data:`HASH_CHUNK` of the payload (the chunks are
    hashed in parallel, as they are read: hashlib lets go of the GIL)."""
    digest = hashlib.sha256(_token_bytes(tokens))
    for part in chunk_digests:
        digest.update(part)
    return digest.hexdigest()


def _chunk_digest(view: memoryview) -> bytes:
    return hashlib.sha256(view).digest()


def read_payload(entry: KvEntry) -> bytearray:
    """The entry's payload, checked against its checksum (:class:`Damaged` when it does not match); read
    into one writable buffer a backend can hand to its library without a copy, each chunk hashed on a
    second thread while the next is read."""
    from concurrent.futures import ThreadPoolExecutor

    payload = bytearray(entry.payload_size)
    view = memoryview(payload)
    read = 0
    with entry.path.open("rb", buffering=0) as handle, ThreadPoolExecutor(2) as pool:
        handle.seek(entry.payload_offset)
        digests = []
        for start in range(0, entry.payload_size, HASH_CHUNK):
            part = view[start : start + HASH_CHUNK]
            got = handle.readinto(part)
            read += got or 0
            digests.append(pool.submit(_chunk_digest, part))
        found = checksum(entry.tokens, [future.result() for future in digests])
    if read != entry.payload_size or found != entry.checksum:
        raise Damaged("checksum mismatch")
    return payload


def write_entry(directory: Path, key: str, tokens: Sequence[int], payload: bytes, label: Mapping[str, Any]) -> KvEntry:
    """Keep ``payload`` (the cells of ``tokens``) under ``directory``, atomically."""
    token_bytes = _token_bytes(tokens)
    view = memoryview(payload)
    digest = checksum(tokens, [_chunk_digest(view[i : i + HASH_CHUNK]) for i in range(0, len(payload), HASH_CHUNK)])
    created = time.time()
    head = json.dumps(
        {
            "format": FORMAT,
            "key": key,
            "tokens": len(tokens),
            "payload": len(payload),
            "sha256": digest,
            "created": created,
            "label": dict(label),
        }
    ).encode()
    path = directory / key / (tokens_digest(tokens)[:32] + SUFFIX)
    with atomic_output(path) as handle:
        handle.write(MAGIC + struct.pack("<I", len(head)) + head)
        handle.write(token_bytes)
        handle.write(payload)
    return KvEntry(path, key, tuple(tokens), len(payload), digest, created, dict(label))


def entries(directory: Path | None = None, key: str | None = None) -> Iterator[KvEntry]:
    """Every readable entry (of one model key, or all); damaged files are removed with a warning."""
    root = directory or store_dir()
    folders = [root / key] if key else (sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            if path.name.startswith(PARTIAL_PREFIX):
                continue
            try:
                entry = read_entry(path)
            except FileNotFoundError:
                continue  # removed by another process meanwhile
            except (Damaged, OSError) as exc:
                discard(path, str(exc))
                continue
            if entry.key != folder.name:
                discard(path, "made for another model")
                continue
            yield entry


def discard(path: Path, why: str) -> None:
    _log.warning("KV cache: removed %s (%s); the prefix is evaluated again", path.name, why)
    path.unlink(missing_ok=True)


def total_size(directory: Path | None = None) -> int:
    return sum(entry.size for entry in entries(directory))


class KvStore:
    """One loaded model's view of the store: look a prompt up, keep a prefix, stay under ``limit`` bytes.

    ``whole`` (set by a backend whose cache keeps a sliding window: the cells before the window are not
    saved, so a kept prefix cannot be cut shorter) uses an entry only where the prompt holds it whole."""

    def __init__(self, key: str, label: Mapping[str, Any], *, directory: Path | None = None, limit: int) -> None:
        self.key = key
        self.label = dict(label)
        self.directory = directory or store_dir()
        self.limit = limit
        self.whole = False
        self.saved = 0  # entries written by this process
        self._listing: tuple[int, list[KvEntry]] | None = None  # (the folder's mtime, its entries)

    def _entries(self) -> list[KvEntry]:
        """This model's entries, read again only when its folder changed (a file added, renamed or removed:
        a lookup, a keep and its checks read the headers once between them; this store's own writes and
        removals start a new reading). A file damaged in place is still caught: every payload is checked as
        it is loaded."""
        try:
            stamp = (self.directory / self.key).stat().st_mtime_ns
        except OSError:
            return []
        if self._listing is None or self._listing[0] != stamp:
            self._listing = (stamp, list(entries(self.directory, self.key)))
        return self._listing[1]

    def lookup(self, ids: Sequence[int], better_than: int = 0, *, prompt: bool = True) -> tuple[KvEntry, int] | None:
        """The entry that spares the most of ``ids`` and how many tokens it spares (its common prefix,
        less the last prompt token, which is evaluated for its logits); None unless it spares at least
        :data:`MIN_REUSE` and more than ``better_than`` (what the model's cells already hold)."""
        best: tuple[KvEntry, int] | None = None
        for entry in self._entries():
            usable = min(common_prefix(entry.tokens, ids), len(ids) - 1 if prompt else len(ids))
            if usable < max(MIN_REUSE, better_than + 1) or (self.whole and usable < len(entry.tokens)):
                continue
            if best is None or (usable, -entry.payload_size) > (best[1], -best[0].payload_size):
                best = (entry, usable)
        return best

    def branch(self, ids: Sequence[int]) -> int:
        """Where ``ids`` leaves the longest prefix it shares with an entry that goes on differently (a
        new question after the same document), when that prefix is worth keeping by itself; else 0."""
        longest = 0
        for entry in self._entries():
            shared = common_prefix(entry.tokens, ids)
            if shared < len(entry.tokens) and shared < len(ids) - 1:
                longest = max(longest, shared)
        return longest if longest >= MIN_SAVE and self.wanted(ids[:longest]) else 0

    def load(self, entry: KvEntry) -> bytearray | None:
        """The entry's payload, checked; None (and the file removed) when it is damaged."""
        try:
            payload = read_payload(entry)
        except FileNotFoundError:
            self._listing = None
            return None
        except (Damaged, OSError) as exc:
            discard(entry.path, str(exc))
            self._listing = None
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # least recently used goes first
        return payload

    def wanted(self, tokens: Sequence[int]) -> bool:
        """Whether the cells of ``tokens`` are worth keeping: long enough, and not held by an entry already
        (one that starts with them; with ``whole``, one of exactly them)."""
        if len(tokens) < MIN_SAVE:
            return False
        return not any(
            (len(entry.tokens) == len(tokens) or (len(entry.tokens) > len(tokens) and not self.whole))
            and common_prefix(entry.tokens, tokens) == len(tokens)
            for entry in self._entries()
        )

    def save(self, tokens: Sequence[int], payload: bytes, *, replace_shorter: bool = False) -> KvEntry | None:
        """Keep ``payload`` for ``tokens``; with ``replace_shorter`` (a conversation that went on) the entries
        it extends go, so a conversation keeps one file. The least recently used go until the store fits
        its limit. None when the disk cannot take it."""
        if len(payload) + len(MAGIC) > self.limit:
            return None
        try:
            clean_partials(self.directory / self.key)
            entry = write_entry(self.directory, self.key, tokens, payload, self.label)
        except OSError as exc:
            _log.warning("KV cache: could not keep %d tokens (%s)", len(tokens), exc.strerror or exc)
            return None
        self.saved += 1
        self._listing = None
        for other in self._entries() if replace_shorter else ():
            extended = len(other.tokens) < len(tokens) and common_prefix(other.tokens, tokens) == len(other.tokens)
            if extended and other.path != entry.path:
                other.path.unlink(missing_ok=True)
        evict(self.directory, self.limit, keep=entry.path)
        self._listing = None
        return entry


def evict(directory: Path, limit: int, keep: Path | None = None) -> list[KvEntry]:
    """Remove least recently used entries (of every model) until the store holds at most ``limit`` bytes."""
    every = sorted(entries(directory), key=lambda entry: entry.used)
    total = sum(entry.size for entry in every)
    removed: list[KvEntry] = []
    for entry in every:
        if total <= limit:
            break
        if entry.path == keep:
            continue
        total -= entry.size
        entry.path.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def remove(directory: Path | None = None, *, key: str | None = None) -> tuple[int, int]:
    """Remove every entry (of one model key, or all): how many files and bytes."""
    count = size = 0
    for entry in list(entries(directory, key)):
        size += entry.size
        entry.path.unlink(missing_ok=True)
        count += 1
    root = directory or store_dir()
    if root.is_dir():
        for folder in root.iterdir():
            with contextlib.suppress(OSError):
                folder.rmdir()  # empty ones only
    return count, size
