"""Batch input and output files (pure parsing; atomic-enough appends).

Input: one prompt per line, or JSONL objects ``{"id", "prompt"}`` / ``{"id", "messages"}``
with optional per-line ``max_tokens``, ``temperature`` and ``seed``, and the answer's format:
``response_format`` (OpenAI's shape) or ``schema`` (a JSON Schema); or the OpenAI Batch API's
input lines ``{"custom_id", "method", "url", "body"}``, answered in its output shape, so a job
moves between a cloud batch API and llmrun unchanged. Output: JSONL, one
object per input, in input order, each line written (and flushed) as soon as it and
every line before it are done, so an interrupted run leaves a valid prefix that
``--resume`` continues from.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from llmrun.errors import InvalidParameter, UsageError
from llmrun.structured.formats import Format, from_schema, response_format

OVERRIDES = ("max_tokens", "temperature", "seed")
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True)
class Item:
    line: int
    id: str  # the key (ids compare as text)
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)
    raw_id: str | int | None = None  # the id as written in the input (line number for text input)
    response_format: Format | None = None  # this line's answer format (None: the command's)
    openai: OpenAiLine | None = None  # an OpenAI Batch API line (its body is parsed as the server parses one)
    images: tuple[str, ...] = ()  # image files the model reads before the prompt (or the last user message)

    @property
    def output_id(self) -> str | int:
        return self.raw_id if self.raw_id is not None else int(self.id)


@dataclass(frozen=True, slots=True)
class OpenAiLine:
    """An OpenAI Batch API request: ``url`` is /v1/chat/completions or /v1/completions."""

    url: str
    body: dict[str, Any]

    @property
    def chat(self) -> bool:
        return self.url == "/v1/chat/completions"


OPENAI_URLS = ("/v1/chat/completions", "/v1/completions")
OPENAI_KEYS = ("custom_id", "method", "url", "body")


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    message: str


def parse(lines: Iterable[str], *, jsonl: bool | None = None) -> Iterator[Item | LineError]:
    """Items in file order; ``jsonl=None`` decides by the first non-empty line."""
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        text = raw.rstrip("\n").rstrip("\r")
        if not text.strip():
            continue
        if jsonl is None:
            jsonl = text.lstrip().startswith("{")
        result = _json_item(number, text) if jsonl else Item(number, str(number), prompt=text)
        if isinstance(result, Item):
            if result.id in seen:
                result = LineError(number, f"id {result.id!r} appears twice")
            else:
                seen.add(result.id)
        yield result


def _json_item(number: int, text: str) -> Item | LineError:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return LineError(number, f"not valid JSON ({exc.msg} at column {exc.colno})")
    if not isinstance(value, dict):
        return LineError(number, "expected a JSON object")
    if "custom_id" in value:
        return _openai_item(number, value)
    item_id = value.get("id", number)
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
        return LineError(number, "id must be a string or an integer")
    overrides = {k: value[k] for k in OVERRIDES if k in value}
    unknown = set(value) - {"id", "prompt", "messages", "images", *OVERRIDES, *FORMATS}
    if unknown:
        allowed = ", ".join(["id", "prompt", "messages", "images", *OVERRIDES, *FORMATS])
        return LineError(number, f"unknown keys {sorted(unknown)} (allowed: {allowed})")
    fmt = _format(value)
    if isinstance(fmt, str):
        return LineError(number, fmt)
    images = value.get("images", [])
    if not isinstance(images, list) or not all(isinstance(image, str) and image for image in images):
        return LineError(number, "images must be a list of image file paths")
    if isinstance(value.get("prompt"), str) and "messages" not in value:
        return Item(
            number,
            str(item_id),
            prompt=value["prompt"],
            overrides=overrides,
            raw_id=item_id,
            response_format=fmt,
            images=tuple(images),
        )
    messages = value.get("messages")
    if "prompt" not in value and isinstance(messages, list) and messages:
        pairs = []
        for message in messages:
            if (
                not isinstance(message, dict)
                or message.get("role") not in ROLES
                or not isinstance(message.get("content"), str)
            ):
                return LineError(number, "each message needs a role (system, user, assistant) and text content")
            pairs.append((message["role"], message["content"]))
        return Item(
            number,
            str(item_id),
            messages=tuple(pairs),
            overrides=overrides,
            raw_id=item_id,
            response_format=fmt,
            images=tuple(images),
        )
    return LineError(number, 'needs either "prompt" (a string) or "messages" (a non-empty list), not both')


FORMATS = ("response_format", "schema")


def _openai_item(number: int, value: dict[str, Any]) -> Item | LineError:
    """An OpenAI Batch API line (its body is checked when the request is built, as the server checks one)."""
    unknown = set(value) - set(OPENAI_KEYS)
    if unknown:
        return LineError(
            number, f"unknown keys {sorted(unknown)} in an OpenAI batch line (allowed: {', '.join(OPENAI_KEYS)})"
        )
    custom_id = value["custom_id"]
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(number, "custom_id must be a non-empty string")
    if value.get("method", "POST") != "POST":
        return LineError(number, 'method must be "POST"')
    url = value.get("url")
    if url not in OPENAI_URLS:
        return LineError(number, f"url must be one of {', '.join(OPENAI_URLS)}, got {url!r}")
    body = value.get("body")
    if not isinstance(body, dict):
        return LineError(number, "body must be a JSON object (the request's body)")
    return Item(number, custom_id, raw_id=custom_id, openai=OpenAiLine(url, body))


def openai_result(custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Batch API output line (a request that failed has none: like the API's output file, the
    output holds answers only, and ``--resume`` tries the failed ones again)."""
    import uuid

    response = {"status_code": 200, "request_id": f"req_{uuid.uuid4().hex[:24]}", "body": body}
    return {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": custom_id, "response": response, "error": None}


def _format(value: dict[str, Any]) -> Format | str | None:
    """The line's answer format, or what is wrong with it."""
    if "response_format" in value and "schema" in value:
        return "give response_format or schema, not both"
    try:
        if "schema" in value:
            return from_schema(value["schema"])
        if "response_format" in value:
            return response_format(value["response_format"])
    except InvalidParameter as exc:
        return f"{exc.name} must be {exc.expected}"
    return None


def finished_ids(path: Path) -> set[str]:
    """Ids already in an output file; a torn last line (a crash mid-write) is cut off first."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    keep = data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        with path.open("r+b") as handle:
            handle.truncate(len(keep))
    ids = set()
    for number, line in enumerate(keep.decode("utf-8", errors="replace").splitlines(), start=1):
        try:
            record = json.loads(line)
            ids.add(str(record["custom_id"] if "custom_id" in record else record["id"]))
        except (ValueError, KeyError, TypeError):
            raise UsageError(
                f"{path}:{number} is not a batch result line", "`resume` needs the output of an earlier batch run"
            ) from None
    return ids


class OrderedWriter:
    """Writes results in input order, each as soon as all earlier ones are written."""

    def __init__(self, out: IO[str], order: list[str]) -> None:
        self.out = out
        self.order = order
        self.next = 0
        self.waiting: dict[str, dict[str, Any]] = {}

    def add(self, item_id: str, record: dict[str, Any] | None) -> None:
        """``record`` None: this id produced no line (it failed); do not wait for it."""
        self.waiting[item_id] = record or {}
        while self.next < len(self.order) and self.order[self.next] in self.waiting:
            ready = self.waiting.pop(self.order[self.next])
            if ready:
                self.out.write(json.dumps(ready, ensure_ascii=False) + "\n")
                self.out.flush()
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    os.fsync(self.out.fileno())
            self.next += 1
