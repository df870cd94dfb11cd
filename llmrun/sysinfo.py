"""Facts about this machine that plans and stats need (memory, cores)."""

from __future__ import annotations

import os
import resource
import sys


def available_memory() -> int:
    """Bytes of memory available to a new allocation without swapping."""
    import psutil

    return int(psutil.virtual_memory().available)


def peak_rss() -> int:
    """This process's peak resident memory in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


def default_threads() -> int:
    """Physical cores (what llama.cpp's own CLI uses); logical cores when unknown."""
    import psutil

    return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)
