"""Files written whole or not at all: atomic writes, sha256, free space, and the progress callback type.

Every file llmrun writes lands through a temporary file in the same directory and an
``os.replace``, so a crash, a full disk or Ctrl-C never leaves a half-written file under its final name."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from llmrun.errors import StoreError
from llmrun.units import format_bytes

CHUNK = 1024 * 1024
Progress = Callable[[str, int, int], None]  # a progress callback: file name, bytes done, total bytes
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a name that becomes a file name: no paths
PARTIAL_PREFIX = ".partial-"
DISK_MARGIN = 64 * 1024 * 1024


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A binary file that appears at ``path`` only when the block completes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f"{PARTIAL_PREFIX}{os.getpid()}-", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_output(path) as handle:
        handle.write(text.encode("utf-8"))


def clean_partials(directory: Path) -> None:
    """Remove temporary files left by processes that died mid-write."""
    import psutil

    if not directory.is_dir():
        return
    for leftover in directory.glob(f"{PARTIAL_PREFIX}*"):
        pid_text = leftover.name[len(PARTIAL_PREFIX) :].split("-", 1)[0]
        if not (pid_text.isdigit() and psutil.pid_exists(int(pid_text))):
            leftover.unlink(missing_ok=True)


def check_free_space(directory: Path, needed: int, what: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < needed + DISK_MARGIN:
        raise StoreError(
            f"not enough disk space for {what}: needs {format_bytes(needed)}, {format_bytes(free)} free in {directory}",
            "free some disk space, or point LLMRUN_HOME at a larger disk",
        )
