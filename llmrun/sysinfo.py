"""Facts about this machine that plans and stats need (memory, cores).

On Linux they come from /proc, which costs microseconds; psutil (≈ 6 ms to import) answers
elsewhere, and wherever /proc does not say."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

PROC = Path("/proc")


def available_memory() -> int:
    """Bytes of memory available to a new allocation without swapping."""
    found = meminfo_available(_read(PROC / "meminfo"))
    if found is not None:
        return found
    import psutil

    return int(psutil.virtual_memory().available)


def peak_rss() -> int:
    """This process's peak resident memory in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


def default_threads() -> int:
    """Physical cores (what llama.cpp's own CLI uses); logical cores when unknown."""
    found = physical_cores(_read(PROC / "cpuinfo"))
    if found is not None:
        return found
    import psutil

    return int(psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def meminfo_available(text: str | None) -> int | None:
    """``MemAvailable`` of a /proc/meminfo text, in bytes (None: not there)."""
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * 1024
    return None


def physical_cores(text: str | None) -> int | None:
    """Distinct (physical id, core id) pairs of a /proc/cpuinfo text, as psutil counts them (None: the
    text does not say, as on many ARM machines)."""
    cores: set[tuple[str, str]] = set()
    physical = core = None
    for line in [*(text or "").splitlines(), ""]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            physical = value.strip()
        elif key == "core id":
            core = value.strip()
        elif not key:  # a blank line ends one processor's block
            if physical is not None and core is not None:
                cores.add((physical, core))
            physical = core = None
    return len(cores) or None


def _read(path: Path) -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
