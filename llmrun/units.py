"""Sizes and durations as people write them."""

from __future__ import annotations

import re

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


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def keep_alive(value: object) -> float | str | None:
    """A request's keep_alive (Ollama's meaning): seconds the model stays loaded after it, None (forever), or
    ``"default"`` when it gives none (the server's --keep-alive). A value that is not a duration: ValueError."""
    if value is None:
        return "default"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"not a duration: {value!r}")
    return parse_duration(value)


def parse_duration(value: str | float) -> float | None:
    """A keep-alive as Ollama reads it: a number of seconds, or a Go duration (``5m``, ``1h30m``, ``300ms``);
    negative means forever (None). Anything else is a ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = float(text)  # "300", "-1": seconds
        except ValueError:
            parts = _DURATION.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError(f"not a duration: {value!r}") from None
            seconds = sign * sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if seconds != seconds or seconds == float("inf"):
        raise ValueError(f"not a duration: {value!r}")
    return None if seconds < 0 else seconds
