"""The Anthropic Messages routes in the server's OpenAPI description (pure): every body the route accepts is
valid here, so what this description forbids the route refuses (schemathesis checks both ways). Fields the
route accepts and leaves aside (:data:`llmrun.api.anthropic.IGNORED`) take any value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmrun.api.anthropic import IGNORED
from llmrun.api.limits import MAX_MESSAGES, MAX_STOP, MAX_STOP_CHARS

JSON = "application/json"
Schema = dict[str, Any]

ERROR: Schema = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
MESSAGE: Schema = {
    "type": "object",
    "required": ["id", "type", "role", "content", "stop_reason", "usage"],
    "properties": {"type": {"const": "message"}, "role": {"const": "assistant"}, "content": {"type": "array"}},
}
COUNT: Schema = {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": {"type": "integer"}}}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _conversation(names: Sequence[str]) -> dict[str, Schema]:
    stop = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
    return {
        "model": {"enum": list(names)},
        "messages": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_MESSAGES,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {"role": {"enum": ["user", "assistant", "system"]}},
            },
        },
        "system": {"anyOf": [{"type": "string"}, {"type": "array"}, {"type": "null"}]},
        "tools": {"type": ["array", "null"]},
        "tool_choice": _nullable({"type": "object"}),
        "thinking": _nullable({"type": "object"}),
        "output_config": _nullable({"type": "object"}),
        "stop_sequences": _nullable({"anyOf": [stop, {"type": "array", "items": stop, "maxItems": MAX_STOP}]}),
        **{name: {} for name in sorted(IGNORED)},
    }


def _post(summary: str, body: Schema, ok: Schema, stream: bool) -> dict[str, Any]:
    content: dict[str, Any] = {JSON: {"schema": ok}, **({"text/event-stream": {"schema": {}}} if stream else {})}
    errors = {str(s): {"description": "an error", "content": {JSON: {"schema": ERROR}}} for s in (400, 404, 413, 503)}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {JSON: {"schema": body}}},
            "responses": {"200": {"description": "ok", "content": content}, **errors},
        }
    }


def paths(names: Sequence[str]) -> dict[str, Any]:
    conversation = _conversation(names)
    messages = {
        **conversation,
        "max_tokens": {"type": "integer", "minimum": 1},
        "stream": {"type": "boolean"},
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "top_k": _nullable({"type": "integer", "minimum": 0}),
    }
    closed = {"type": "object", "additionalProperties": False}
    return {
        "/v1/messages": _post(
            "Anthropic: a message",
            {**closed, "properties": messages, "required": ["model", "messages", "max_tokens"]},
            MESSAGE,
            stream=True,
        ),
        "/v1/messages/count_tokens": _post(
            "Anthropic: count a conversation's tokens",
            {**closed, "properties": conversation, "required": ["model", "messages"]},
            COUNT,
            stream=False,
        ),
    }
