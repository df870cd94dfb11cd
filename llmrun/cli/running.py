"""``llmrun ps`` and ``llmrun stop``: what a running server holds, and unloading a model there.

Both speak Ollama's API (``GET /api/ps``; ``POST /api/generate`` with no prompt and ``keep_alive: 0``), so they
work against any Ollama-compatible server as well as llmrun's own (which adds each model's slots). The key,
when the server has one, comes from ``LLMRUN_API_KEY`` or ``--api-key-file``, never from the command line
(where ``ps`` would show it).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from llmrun.errors import LlmrunError, UsageError

DEFAULT_URL = "http://127.0.0.1:8080"
URL_HELP = f"The server: llmrun's (default {DEFAULT_URL}) or any Ollama-compatible one (http://127.0.0.1:11434)."
KEY_HELP = "A file holding the server's key (default: the LLMRUN_API_KEY environment variable)."

Url = Annotated[str, typer.Option("--url", help=URL_HELP)]
KeyFile = Annotated[Path | None, typer.Option("--api-key-file", help=KEY_HELP, show_default=False)]


def ps(
    url: Url = DEFAULT_URL,
    as_json: Annotated[bool, typer.Option("--json", help="The server's answer as JSON.")] = False,
    api_key_file: KeyFile = None,
) -> None:
    """What a running server holds: each model loaded, its memory, context, slots, and until when.

    Examples:

      llmrun ps

      llmrun ps --url http://127.0.0.1:11434     # an Ollama server
    """
    from llmrun.cli import render

    answer = _call("GET", url, "/api/ps", None, api_key_file)
    models = answer.get("models") or []
    if as_json:
        render.print_json(answer)
        return
    if not models:
        render.note(f"no model is loaded at {url}")
        return
    rows = [_row(model) for model in models]
    render.table("", ["NAME", "SIZE", "PROCESSOR", "CONTEXT", "SLOTS", "UNTIL"], rows, stdout=True)


def stop(
    model: Annotated[str, typer.Argument(help="The model to unload.", show_default=False)],
    url: Url = DEFAULT_URL,
    api_key_file: KeyFile = None,
) -> None:
    """Unload a model from a running server (it loads again when a request asks for it).

    Examples:

      llmrun stop gemma3:270m
    """
    from llmrun.cli import render

    loaded = [m.get("name") or m.get("model") for m in _call("GET", url, "/api/ps", None, api_key_file)["models"]]
    if model not in loaded:
        raise UsageError(f"{model} is not loaded at {url}", f"loaded there: {', '.join(map(str, loaded)) or 'none'}")
    _call("POST", url, "/api/generate", {"model": model, "keep_alive": 0}, api_key_file)
    render.note(f"stopped {model} at {url}")


def _row(model: dict[str, Any]) -> list[str]:
    from llmrun.units import format_bytes

    size, vram = int(model.get("size") or 0), int(model.get("size_vram") or 0)
    processor = "100% CPU" if not vram else "100% GPU" if vram >= size else f"{100 * vram // max(size, 1)}% GPU"
    extra = model.get("llmrun") or {}
    slots = f"{extra.get('busy', 0)} busy / {extra['slots']}" if "slots" in extra else "-"
    context = model.get("context_length")
    return [
        str(model.get("name") or model.get("model")),
        format_bytes(size) if size else "-",
        processor,
        f"{context:,}" if isinstance(context, int) else "-",
        slots,
        _until(model.get("expires_at")),
    ]


def _until(expires: Any) -> str:
    """Ollama's expires_at as people read it: "in 4 minutes", "forever" (years away)."""
    if not isinstance(expires, str):
        return "-"
    try:
        when = datetime.fromisoformat(expires.replace("Z", "+00:00"))
    except ValueError:
        return expires
    seconds = (when - datetime.now(UTC)).total_seconds()
    if seconds > 365 * 24 * 3600:
        return "forever"
    if seconds < 90:
        return f"in {max(0, int(seconds))} s"
    if seconds < 5400:
        return f"in {round(seconds / 60)} min"
    return f"in {seconds / 3600:.1f} h"


def _call(method: str, url: str, path: str, body: dict[str, Any] | None, key_file: Path | None) -> Any:
    import httpx

    key = key_file.read_text().strip() if key_file is not None else os.environ.get("LLMRUN_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        answer = httpx.request(method, url.rstrip("/") + path, json=body, headers=headers, timeout=60)
    except httpx.HTTPError:
        raise UsageError(f"no server answers at {url}", "start one with `llmrun serve`, or pass --url") from None
    if answer.status_code == 401:
        raise UsageError(f"the server at {url} wants a key", "set LLMRUN_API_KEY or pass --api-key-file")
    if answer.status_code >= 400:
        raise LlmrunError(f"the server at {url} answered {answer.status_code}: {_message(answer)}", "")
    return answer.json()


def _message(answer: Any) -> str:
    try:
        error = answer.json().get("error")
    except ValueError:
        return str(answer.text)[:200]
    return str(error.get("message") if isinstance(error, dict) else error)
