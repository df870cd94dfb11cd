"""Where converted and quantized models are written: refused when they would overwrite
something, checked for disk space first, staged beside the target and renamed into place
only when complete, so a failure, a full disk or Ctrl-C leaves nothing half-written."""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import StoreError, UsageError
from llmrun.files import check_free_space

if TYPE_CHECKING:
    from collections.abc import Iterator

STAGING_PREFIX = ".llmrun-partial-"


def check_destination(dest: Path, force: bool, estimated_bytes: int, *, directory: bool) -> None:
    """Refuse an existing output (without ``force``), one of the wrong kind, or a disk too full."""
    if dest.exists() and not force:
        raise UsageError(f"{dest} already exists", "choose another `output`, or pass `force` to replace it")
    if dest.exists() and directory and not (dest / "config.json").is_file():
        raise UsageError(f"{dest} exists and is not a model directory", "choose another -o; it is left as it is")
    if dest.exists() and not directory and not dest.is_file():
        raise UsageError(f"{dest} exists and is not a file", "choose another -o; it is left as it is")
    parent = dest.parent if dest.parent != Path("") else Path.cwd()
    check_free_space(parent, estimated_bytes, f"the output {dest.name}")


@contextmanager
def staged(dest: Path, force: bool, *, directory: bool) -> Iterator[Path]:
    """A path beside ``dest`` to write (a created directory, or a file name) that becomes
    ``dest`` when the block completes; removed on any failure, Ctrl-C included."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f"{STAGING_PREFIX}{os.getpid()}-{dest.name}"
    _remove(staging)
    if directory:
        staging.mkdir()
    try:
        yield staging
        if not staging.exists():
            raise StoreError(f"nothing was written for {dest}", "report this with `debug`")
        if dest.exists() and force and directory:
            old = dest.parent / f".llmrun-old-{os.getpid()}-{dest.name}"
            dest.rename(old)
            staging.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, dest)
    except OSError as exc:
        _remove(staging)
        if exc.errno == errno.ENOSPC:
            raise StoreError(
                f"the disk filled up while writing {dest.name}; nothing was kept",
                "free some disk space, or write elsewhere with -o",
            ) from exc
        raise
    except BaseException:
        _remove(staging)
        raise


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def tree_size(path: Path) -> int:
    """Bytes in a file, or in a directory's files."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
