"""One set of limits on what a request may ask for, the same for every wire format llmrun speaks (OpenAI
chat and completions, Ollama, and each API added later), so no route is the open door of the others.

Each check is pure and raises :class:`OverLimit` naming the field (in the body's own spelling, given by the
caller) and the limit; each wire format words it as its API answers errors.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from llmrun.structured.formats import MAX_SOURCE

MAX_STOP = 16  # stop strings a request gives: each one is matched against every generated piece
MAX_STOP_CHARS = 1_000  # characters of one stop string
MAX_MESSAGES = 1_024
MAX_PROMPT_CHARS = 1_000_000  # characters of all the messages (or the prompt) together (~250k tokens)
MAX_TOOLS = 128
MAX_SCHEMA_BYTES = MAX_SOURCE  # a tool's parameters or a response format's schema, as JSON text
MAX_INPUTS = 2_048  # texts (or token arrays) one embedding request may give
MAX_IMAGE_URLS = 8  # http(s) image URLs one request may ask the server to fetch
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's and Anthropic's rule for a function's name


class OverLimit(ValueError):
    """A request past one of the limits: ``field`` is where, ``message`` says the limit; ``status`` is 413
    for too much text, else 400."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.status = status


def stops(value: Any, field: str = "stop") -> tuple[str, ...]:
    """A stop string or a list of them, within the limits."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise OverLimit(field, f"{field} must be a non-empty string or a list of them")
    if len(items) > MAX_STOP:
        raise OverLimit(field, f"{field} has {len(items)} strings; at most {MAX_STOP}")
    long = next((s for s in items if len(s) > MAX_STOP_CHARS), None)
    if long is not None:
        raise OverLimit(field, f"a stop string is {len(long):,} characters; at most {MAX_STOP_CHARS:,}")
    return tuple(items)


def message_count(count: int, field: str = "messages") -> None:
    if count > MAX_MESSAGES:
        raise OverLimit(field, f"{field} has {count:,} messages; at most {MAX_MESSAGES:,}")


def prompt_size(sizes: Sequence[int], field: str = "messages") -> None:
    """The characters of each message (or prompt): together at most :data:`MAX_PROMPT_CHARS`, a 413 naming
    the largest."""
    total = sum(sizes)
    if total <= MAX_PROMPT_CHARS:
        return
    largest = max(range(len(sizes)), key=sizes.__getitem__)
    where = f"{field}[{largest}]" if len(sizes) > 1 else field
    raise OverLimit(
        where,
        f"the request's text is {total:,} characters ({where} alone {sizes[largest]:,}); this server reads at most "
        f"{MAX_PROMPT_CHARS:,} in one request",
        status=413,
    )


def tool_count(count: int, field: str = "tools") -> None:
    if not 1 <= count <= MAX_TOOLS:
        raise OverLimit(field, f"{field} must be an array of 1 to {MAX_TOOLS} tools")


def tool_name(name: Any, field: str) -> str:
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise OverLimit(field, "a function name is 1 to 64 letters, digits, _ or -")
    return name


def tool_names(names: Sequence[str], field: str = "tools") -> None:
    if len(set(names)) != len(names):
        raise OverLimit(field, "each tool needs its own name")


def schema_size(text: str, field: str) -> None:
    size = len(text.encode("utf-8"))
    if size > MAX_SCHEMA_BYTES:
        raise OverLimit(field, f"{field} is {size:,} bytes; at most {MAX_SCHEMA_BYTES:,}")


def input_count(count: int, field: str = "input") -> None:
    if count > MAX_INPUTS:
        raise OverLimit(field, f"{field} has {count:,} items; at most {MAX_INPUTS:,} in one request")


def image_urls(count: int, field: str = "messages") -> None:
    if count > MAX_IMAGE_URLS:
        raise OverLimit(field, f"{count} image URLs to fetch; at most {MAX_IMAGE_URLS} in one request")
