"""Schemathesis hooks for the server's schema test: Ollama's streamed answers (NDJSON) are
validated by their last line, the one that ends the stream (``done`` and the timings), so an
error object in its place fails the response schema."""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.deserializer("application/x-ndjson")
def last_line(ctx: Any, response: Any) -> Any:
    lines = [json.loads(line) for line in response.content.splitlines() if line.strip()]
    if not lines:
        raise ValueError("an empty NDJSON stream")
    return lines[-1]
