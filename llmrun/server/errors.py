"""Errors as each API answers them, and nothing in them that a client should not see: no file system
paths (a model's file is named by its file name, never by where it lies), no keys, no traces."""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse

from llmrun.api.errors import ApiError

# an absolute path of two parts or more (/home/alice/.ollama/…, C:\Users\…), not an endpoint (/v1/…, /api/…)
_PATH = re.compile(
    r"(?<![\w:/.\\])(?:~|[A-Za-z]:)?[/\\](?!(?:v1|api|llmrun|ui|health|metrics)\b)"
    r"(?:[^\s'\"/\\,;:()]+[/\\])+([^\s'\"/\\,;:()]*)"
)


def without_paths(text: str) -> str:
    """``text`` with every absolute file path replaced by its last part (``…/gemma.gguf`` → ``gemma.gguf``)."""
    return _PATH.sub(lambda m: m.group(1) or "…", text)


def error_response(exc: ApiError, path: str = "") -> JSONResponse:
    """The error in the API's own shape: Ollama's ``{"error": "…"}`` under /api/, Anthropic's under
    /v1/messages, else OpenAI's; its message without file paths."""
    from llmrun.api.anthropic import error_body

    exc.message = without_paths(exc.message)
    if path.startswith("/api/"):
        body: dict[str, object] = {"error": exc.message}
    elif path == "/v1/messages" or path.startswith("/v1/messages/"):
        body = error_body(exc.status, exc.message)
    else:
        body = exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)
