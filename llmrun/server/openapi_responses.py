"""The Responses routes in the server's OpenAPI description (pure): every body the route accepts is valid here,
so what this description forbids the route refuses (schemathesis checks both ways). Fields the route accepts
and leaves aside (:data:`llmrun.api.responses.IGNORED`) take any value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmrun.api.responses import IGNORED, INCLUDES, UNSUPPORTED

JSON = "application/json"
Schema = dict[str, Any]

ERROR: Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"}},
        }
    },
}
RESPONSE: Schema = {
    "type": "object",
    "required": ["id", "object", "created_at", "status", "model", "output"],
    "properties": {
        "object": {"const": "response"},
        "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
        "output": {"type": "array", "items": {"type": "object", "required": ["type"]}},
    },
}
DELETED: Schema = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {"deleted": {"const": True}},
}
LIST: Schema = {
    "type": "object",
    "required": ["object", "data", "has_more"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array"}, "has_more": {"type": "boolean"}},
}
COUNT: Schema = {
    "type": "object",
    "required": ["object", "input_tokens"],
    "properties": {"input_tokens": {"type": "integer"}},
}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _errors(statuses: Sequence[int]) -> dict[str, Any]:
    return {str(s): {"description": "an error", "content": {JSON: {"schema": ERROR}}} for s in statuses}


def _conversation(names: Sequence[str]) -> dict[str, Schema]:
    return {
        "model": {"enum": list(names)},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}]},
        "instructions": _nullable({"type": "string"}),
        "previous_response_id": _nullable({"type": "string"}),
        "tools": _nullable({"type": "array", "items": {"type": "object", "required": ["type"]}}),
        "tool_choice": {},
        "parallel_tool_calls": _nullable({"type": "boolean"}),
        "text": _nullable({"type": "object"}),
        "reasoning": _nullable({"type": "object"}),
        "metadata": _nullable({"type": "object"}),
        "include": _nullable({"type": "array", "items": {"enum": sorted(INCLUDES)}}),
        "truncation": {"enum": ["auto", "disabled", None]},
        "background": _nullable({"type": "boolean"}),
        "user": _nullable({"type": "string"}),
        **{name: {"type": "null"} for name in sorted(UNSUPPORTED)},
        **{name: {} for name in sorted(IGNORED)},
    }


def _id_parameter() -> dict[str, Any]:
    return {"name": "ident", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


def paths(names: Sequence[str]) -> dict[str, Any]:
    closed = {"type": "object", "additionalProperties": False}
    create = {
        **_conversation(names),
        "stream": _nullable({"type": "boolean"}),
        "store": _nullable({"type": "boolean"}),
        "stream_options": _nullable({"type": "object"}),
        "max_output_tokens": _nullable({"type": "integer", "minimum": 16}),
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "keep_alive": _nullable({"anyOf": [{"type": "string"}, {"type": "number"}]}),  # llmrun's
    }
    stored = {"200": {"description": "ok", "content": {JSON: {"schema": RESPONSE}}}, **_errors((404,))}
    return {
        "/v1/responses": {
            "post": {
                "summary": "OpenAI: a response",
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": {**closed, "properties": create, "required": ["model", "input"]}}},
                },
                "responses": {
                    "200": {
                        "description": "the response (or, with stream, its events)",
                        "content": {JSON: {"schema": RESPONSE}, "text/event-stream": {"schema": {}}},
                    },
                    **_errors((400, 404, 413, 503)),
                },
            }
        },
        "/v1/responses/input_tokens": {
            "post": {
                "summary": "OpenAI: count a response's input tokens",
                "requestBody": {
                    "required": True,
                    "content": {
                        JSON: {"schema": {**closed, "properties": _conversation(names), "required": ["model", "input"]}}
                    },
                },
                "responses": {
                    "200": {"description": "ok", "content": {JSON: {"schema": COUNT}}},
                    **_errors((400, 404, 413, 503)),
                },
            }
        },
        "/v1/responses/{ident}": {
            "get": {"summary": "OpenAI: a stored response", "parameters": [_id_parameter()], "responses": stored},
            "delete": {
                "summary": "OpenAI: delete a stored response",
                "parameters": [_id_parameter()],
                "responses": {"200": {"description": "ok", "content": {JSON: {"schema": DELETED}}}, **_errors((404,))},
            },
        },
        "/v1/responses/{ident}/input_items": {
            "get": {
                "summary": "OpenAI: a stored response's input items",
                "parameters": [
                    _id_parameter(),
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
                    {"name": "after", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "ok", "content": {JSON: {"schema": LIST}}}, **_errors((400, 404))},
            }
        },
    }
