"""Sizes as people read them."""

from __future__ import annotations

from llmrun.errors import UsageError


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    """``4G``, ``512M``, ``1.5GiB``, ``100000``, ``0`` → bytes (powers of 1024)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    factor = 1
    for suffix, power in (("K", 1), ("M", 2), ("G", 3), ("T", 4)):
        if value.endswith(suffix):
            value, factor = value[:-1], 1024**power
            break
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0 or number == float("inf"):
        raise UsageError(f"not a size: {text!r}", "give bytes or a size like 512M or 4G")
    return int(number * factor)
