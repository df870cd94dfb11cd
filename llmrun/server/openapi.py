"""The server's OpenAPI description (``GET /openapi.json``): every route, OpenAI's (the Responses API's in
:mod:`~llmrun.server.openapi_responses`), Ollama's and Anthropic's (:mod:`~llmrun.server.openapi_anthropic`), with
request bodies as the server checks them and responses as it answers (pure).

Built per request from what the server runs now (the model names it answers to, the longest
answer a request may ask for), so a schema-driven client or tester (schemathesis) sends what
the server accepts, and everything the description forbids is a 4xx in the API's own shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmrun.api.limits import MAX_STOP
from llmrun.api.openai import MAX_TOP_LOGPROBS, REASONING_EFFORTS, Limits
from llmrun.decoding.sampling import MAX_SEED
from llmrun.prompt.template import OWN_VARIABLES
from llmrun.server import openapi_anthropic, openapi_responses

JSON = "application/json"
Schema = dict[str, Any]


def nullable(schema: Schema) -> Schema:
    """``schema`` or null: OpenAI's clients send null for a field they leave unset."""
    return {"anyOf": [schema, {"type": "null"}]}


def number(low: float, high: float, *, exclusive_low: bool = False) -> Schema:
    bound = {"exclusiveMinimum": low} if exclusive_low else {"minimum": low}
    return nullable({"type": "number", **bound, "maximum": high})


def integer(low: int, high: int | None = None) -> Schema:
    return nullable({"type": "integer", "minimum": low, **({"maximum": high} if high is not None else {})})


def closed(properties: dict[str, Schema], required: Sequence[str] = ()) -> Schema:
    """An object with exactly these fields (the server refuses any other by name)."""
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


OPENAI_ERROR: Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
OLLAMA_ERROR: Schema = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
ANY_OBJECT: Schema = {"type": "object"}


def _errors(schema: Schema, statuses: Sequence[int]) -> dict[str, Any]:
    return {str(s): {"description": "an error", "content": {JSON: {"schema": schema}}} for s in statuses}


def _post(summary: str, body: Schema, ok: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {JSON: {"schema": body}}},
            "responses": {"200": ok, **errors},
        }
    }


def _get(summary: str, ok: Schema, errors: dict[str, Any], media: str = JSON) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "responses": {"200": {"description": "ok", "content": {media: {"schema": ok}}}, **errors},
        }
    }


def _sampling(limits: Limits) -> dict[str, Schema]:
    return {
        "temperature": number(0, 2),
        "top_p": number(0, 1, exclusive_low=True),
        "top_k": integer(0),
        "min_p": number(0, 1),
        "repeat_penalty": nullable({"type": "number", "exclusiveMinimum": 0}),
        "repetition_penalty": nullable({"type": "number", "exclusiveMinimum": 0}),
        "repeat_last_n": integer(-1),
        "presence_penalty": number(-2, 2),
        "frequency_penalty": number(-2, 2),
        "seed": integer(0, MAX_SEED),
        "max_tokens": integer(1, limits.max_tokens),
        "stop": nullable(
            {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": MAX_STOP},
                ]
            }
        ),
        "stream": nullable({"type": "boolean"}),
        "stream_options": nullable(
            closed({"include_usage": {"type": "boolean"}, "include_obfuscation": {"type": "boolean"}})
        ),
        "n": integer(1, limits.max_n),
        "user": nullable({"type": "string"}),
        "keep_alive": nullable({"anyOf": [{"type": "string"}, {"type": "number"}]}),  # llmrun's (Ollama's meaning)
    }


TEXT_PART: Schema = closed({"type": {"const": "text"}, "text": {"type": "string"}}, ["type", "text"])
CONTENT: Schema = {"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}]}
TOOL: Schema = closed(
    {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object"},
                "strict": {"type": ["boolean", "null"]},
            },
        },
    },
    ["type", "function"],
)
TOOL_CALL: Schema = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
        },
    },
}
MESSAGES: Schema = {
    "type": "array",
    "minItems": 1,
    "items": {
        "anyOf": [
            closed(
                {"role": {"enum": ["system", "developer", "user"]}, "content": CONTENT, "name": {"type": "string"}},
                ["role", "content"],
            ),
            closed(
                {
                    "role": {"const": "assistant"},
                    "content": {"anyOf": [CONTENT, {"type": "null"}]},
                    "name": {"type": "string"},
                    "reasoning_content": {"type": "string"},
                    "reasoning": {"type": "string"},
                    "refusal": {"type": ["string", "null"]},
                    "tool_calls": {"type": "array", "items": TOOL_CALL},
                },
                ["role", "content"],
            ),
            closed(
                {"role": {"const": "tool"}, "content": CONTENT, "tool_call_id": {"type": "string", "minLength": 1}},
                ["role", "content", "tool_call_id"],
            ),
        ]
    },
}


def _chat_request(names: list[str], limits: Limits) -> Schema:
    return closed(
        {
            "model": {"enum": names},
            "messages": MESSAGES,
            **_sampling(limits),
            "max_completion_tokens": integer(1, limits.max_tokens),
            "logprobs": nullable({"type": "boolean"}),
            "top_logprobs": integer(0, MAX_TOP_LOGPROBS),
            "response_format": nullable(
                {
                    "anyOf": [
                        closed({"type": {"const": "text"}}, ["type"]),
                        closed({"type": {"const": "json_object"}}, ["type"]),
                    ]
                }
            ),
            "tools": nullable({"type": "array", "items": TOOL, "minItems": 1, "maxItems": 64}),
            "tool_choice": nullable({"enum": ["auto", "none", "required"]}),
            "parallel_tool_calls": nullable({"type": "boolean"}),
            "chat_template_kwargs": nullable(
                {
                    "type": "object",
                    "propertyNames": {"not": {"enum": sorted(OWN_VARIABLES)}},
                }
            ),
            "reasoning_effort": nullable({"enum": list(REASONING_EFFORTS)}),
            "continue_final_message": nullable({"type": "boolean"}),
            "store": nullable({"type": "boolean", "const": False}),
            "metadata": nullable({"type": "object"}),
        },
        ["model", "messages"],
    )


def _completion_request(names: list[str], limits: Limits) -> Schema:
    prompt = {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 8}]
    }
    return closed(
        {
            "model": {"enum": names},
            "prompt": prompt,
            **_sampling(limits),
            "logprobs": integer(0, MAX_TOP_LOGPROBS),
            "echo": nullable({"type": "boolean", "const": False}),
            "suffix": nullable({"type": "string", "maxLength": 0}),
            "best_of": integer(1, 1),
            "response_format": nullable(closed({"type": {"enum": ["text", "json_object"]}}, ["type"])),
        },
        ["model", "prompt"],
    )


CHAT_OK: Schema = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "object": {"const": "chat.completion"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "message", "finish_reason"],
                "properties": {
                    "message": {
                        "type": "object",
                        "required": ["role"],
                        "properties": {"content": {"type": ["string", "null"]}},
                    },
                    "finish_reason": {"enum": ["stop", "length", "tool_calls"]},
                },
            },
        },
        "usage": {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"]},
    },
}
COMPLETION_OK: Schema = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "object": {"const": "text_completion"},
        "choices": {"type": "array", "items": {"type": "object", "required": ["index", "text", "finish_reason"]}},
    },
}
EVENTS = "text/event-stream"
NDJSON = "application/x-ndjson"


def _ok(schema: Schema, stream_media: str) -> dict[str, Any]:
    return {
        "description": "the answer (or, with stream, its events)",
        "content": {JSON: {"schema": schema}, stream_media: {"schema": {}}},
    }


def _ollama(names: list[str]) -> dict[str, Any]:
    options = {"type": "object"}
    model = {"type": "string", "enum": names}
    message = {  # open, as Ollama's: fields a message may carry beyond these are ignored
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"enum": ["system", "user", "assistant", "tool"]},
            "content": {"type": "string"},
            "thinking": {"type": ["string", "null"]},
            "tool_name": {"type": ["string", "null"]},
        },
    }
    think = {"anyOf": [{"type": "boolean"}, {"enum": ["high", "medium", "low"]}, {"type": "null"}]}
    common = {
        "model": model,
        "options": nullable(options),
        "stream": {"type": "boolean"},
        "keep_alive": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]},
        "format": {"anyOf": [{"const": "json"}, {"type": "object"}, {"const": ""}, {"type": "null"}]},
        "think": think,
    }
    generate = closed(
        {**common, "prompt": {"type": "string"}, "system": nullable({"type": "string"}), "raw": {"type": "boolean"}},
        ["model"],
    )
    # (no messages, or none: Ollama's form that loads the model, or unloads it with keep_alive 0)
    chat = closed({**common, "messages": nullable({"type": "array", "items": message})}, ["model"])
    errors = _errors(OLLAMA_ERROR, (400, 404, 503))
    answer = {"type": "object", "required": ["model", "created_at", "done"]}
    listing = {"type": "object", "required": ["models"], "properties": {"models": {"type": "array"}}}
    return {
        "/api/version": _get("Ollama: the version", {"type": "object", "required": ["version"]}, {}),
        "/api/tags": _get("Ollama: the models", listing, {}),
        "/api/ps": _get("Ollama: the loaded models", listing, {}),
        "/api/show": _post(
            "Ollama: a model's details",
            closed({"model": model, "verbose": {"type": "boolean"}}, ["model"]),
            {"description": "ok", "content": {JSON: {"schema": ANY_OBJECT}}},
            errors,
        ),
        "/api/generate": _post("Ollama: complete a prompt", generate, _ok(answer, NDJSON), errors),
        "/api/chat": _post("Ollama: answer a conversation", chat, _ok(answer, NDJSON), errors),
    }


def describe(names: Sequence[str], limits: Limits, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 description of the routes, for the models ``names`` within the server's ``limits``."""
    served = list(names)
    openai_errors = _errors(OPENAI_ERROR, (400, 404, 413, 503))
    models = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array"}},
    }
    card = {"type": "object", "required": ["id", "object", "owned_by"]}
    paths: dict[str, Any] = {
        "/health": _get("Liveness: the models served", {"type": "object", "required": ["status"]}, {}),
        "/v1/models": _get("OpenAI: the models", models, {}),
        "/v1/models/{model}": {
            "get": {
                "summary": "OpenAI: one model",
                "parameters": [
                    {"name": "model", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
                ],
                "responses": {
                    "200": {"description": "ok", "content": {JSON: {"schema": card}}},
                    **_errors(OPENAI_ERROR, (404,)),
                },
            }
        },
        "/v1/chat/completions": _post(
            "OpenAI: a chat completion", _chat_request(served, limits), _ok(CHAT_OK, EVENTS), openai_errors
        ),
        "/v1/completions": _post(
            "OpenAI: a text completion",
            _completion_request(served, limits),
            _ok(COMPLETION_OK, EVENTS),
            openai_errors,
        ),
        **_ollama(served),
        **openapi_anthropic.paths(served),
        **openapi_responses.paths(served),
    }
    limits_info = {"max_tokens": limits.max_tokens, "request_timeout_s": limits.request_timeout_s}
    info = {"title": "llmrun", "version": version, "x-llmrun-limits": limits_info}  # the operator's bounds
    return {"openapi": "3.1.0", "info": info, "paths": paths}
