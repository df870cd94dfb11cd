"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``): bodies in, engine requests
out; engine results in, Messages bodies out (pure). What Claude Code and the ``anthropic`` SDK send.

Follows Anthropic's API reference field by field. ``system`` is a string or text blocks; content blocks are
``text``, ``image`` (base64), ``tool_use`` (an assistant's call), ``tool_result`` (its answer, a string or
blocks, ``is_error``), ``thinking`` and ``redacted_thinking`` (earlier reasoning); ``tools`` carry an
``input_schema`` and ``tool_choice`` is ``auto``, ``any``, ``tool`` or ``none``, constrained as the OpenAI
route's are. What a real client sends and llmrun cannot honour is accepted and left aside (:data:`IGNORED`,
and ``cache_control`` on any block: the prefix cache needs no marks); a field Anthropic does not define, or
one that is wrong, is a 400 naming it. An answer is never refused for asking more than the server's
``--max-tokens``: agents ask for their whole budget (Claude Code: 32,000), so it is cut there and ends with
``stop_reason: "max_tokens"``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from llmrun.api import limits
from llmrun.api.errors import ApiError, worded
from llmrun.api.openai import Limits
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.request import Request
from llmrun.engine.result import Result
from llmrun.errors import InvalidParameter
from llmrun.prompt.template import Message, ToolCall
from llmrun.structured.formats import Format, from_schema
from llmrun.structured.tools import Tool, ToolUse

FIELDS = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k"}
FIELDS |= {"tools", "tool_choice", "thinking"}
# sent by real clients, accepted and left aside (docs/agents.md says why each one)
FIELDS |= {"output_config"}  # its format (a JSON Schema) is enforced while decoding; its effort left aside
IGNORED = {
    "cache_control",  # automatic prompt caching: the prefix cache keeps every prefix without marks
    "metadata",  # user_id for Anthropic's abuse checks
    "context_management",  # server-side clearing of old tool results: the client resends what it keeps
    "service_tier",  # priority capacity
    "speed",  # Anthropic's fast mode
    "inference_geo",  # where Anthropic runs it
    "diagnostics",  # Anthropic's prompt-cache miss reports
    "user_profile_id",  # whom Anthropic bills
    "workspace_id",
    "container",  # Anthropic's code-execution containers
    "mcp_servers",  # Anthropic-side MCP connectors: tools that run there, not here
    "betas",
}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config"} | IGNORED
STOP_REASON = {"eos": "end_turn", "stop": "end_turn", "length": "max_tokens", "context": "max_tokens"}
STOP_REASON["time"] = "max_tokens"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """An error as Anthropic answers it."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def bad(field: str, message: str, status: int = 400) -> ApiError:
    return ApiError(status, message if message.startswith(field) else f"{field}: {message}", param=field)


@dataclass(frozen=True, slots=True)
class MessagesCall:
    model: str
    request: Request
    stream: bool
    stop_sequences: tuple[str, ...]
    skipped_tools: tuple[str, ...] = ()  # server tools (web search, code execution…) that cannot run here


def parse_messages(body: Any, defaults: SamplingParams, limits_: Limits) -> MessagesCall:
    body = _object(body, FIELDS | IGNORED)
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad("max_tokens", "max_tokens is required: an integer of at least 1")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "stream must be a boolean")
    system, messages = _conversation(body)
    tools, skipped = _tools(body.get("tools"), body.get("tool_choice"))
    params, stops = _params(body, defaults, min(max_tokens, limits_.max_tokens))
    think = _thinking(body.get("thinking"))
    try:
        request = Request(
            messages=((Message("system", system),) if system else ()) + messages,
            params=params,
            tools=tools,
            think=think,
            response_format=_output_format(body.get("output_config")),
        )
    except InvalidParameter as exc:
        raise bad(exc.name, worded(exc.message)) from None
    return MessagesCall(body["model"], request, stream, stops, skipped)


def parse_count(body: Any) -> Request:
    """``/v1/messages/count_tokens``: the conversation whose prompt tokens are counted."""
    body = _object(body, COUNT_FIELDS)
    system, messages = _conversation(body)
    tools, _ = _tools(body.get("tools"), body.get("tool_choice"))
    return Request(
        messages=((Message("system", system),) if system else ()) + messages,
        tools=tools,
        think=_thinking(body.get("thinking")),
        response_format=_output_format(body.get("output_config")),
    )


def _object(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(unknown[0], f"{unknown[0]}: Extra inputs are not permitted")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad("model", "model is required: a string naming a model this server runs")
    return body


def _params(body: dict[str, Any], defaults: SamplingParams, max_tokens: int) -> tuple[SamplingParams, tuple[str, ...]]:
    values: dict[str, Any] = {"max_tokens": max_tokens}
    for name, low, high in (("temperature", 0.0, 1.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad(name, f"{name} must be a number")
        if not low <= value <= high:
            raise bad(name, f"{name} must be in [{low:g}, {high:g}]")
        values[name] = float(value)
    top_k = body.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise bad("top_k", "top_k must be a non-negative integer")
        values["top_k"] = top_k
    stops: tuple[str, ...] = ()
    if body.get("stop_sequences") is not None:
        try:
            stops = limits.stops(body["stop_sequences"], "stop_sequences")
        except limits.OverLimit as exc:
            raise bad(exc.field, exc.message, exc.status) from None
        values["stop"] = tuple(dict.fromkeys([*defaults.stop, *stops]))  # the model's own stops too
    try:
        return dataclasses.replace(defaults, **values), stops
    except InvalidParameter as exc:
        raise bad(exc.name, worded(exc.message)) from None


def _output_format(value: Any) -> Format | None:
    """``output_config.format``: a JSON Schema the answer follows (enforced while decoding)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("output_config", "output_config must be an object")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad("output_config.format", 'output_config.format is {"type": "json_schema", "schema": {…}}')
    try:
        return from_schema(fmt["schema"], parameter="output_config.format.schema")
    except InvalidParameter as exc:
        raise bad("output_config.format.schema", f"the schema must be {exc.expected}") from None


def _thinking(value: Any) -> bool | None:
    """``thinking``: enabled (with a budget) or between tools, adaptive (the model's default), or disabled."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("enabled", "between_tools"):
        return True
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return None
    raise bad("thinking", 'thinking must be {"type": "enabled", "budget_tokens": N}, "adaptive" or "disabled"')


# --- the conversation ----------------------------------------------------------------------------------


def _conversation(body: dict[str, Any]) -> tuple[str, tuple[Message, ...]]:
    """The system prompt (``system``, and any ``system`` message a client puts among the messages, folded
    into it in order: many chat templates refuse a system turn after the first) and the messages."""
    systems = [_system(body.get("system"))]
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "messages must be a non-empty array")
    try:
        limits.message_count(len(raw))
        limits.prompt_size([_size(m) for m in raw])
    except limits.OverLimit as exc:
        raise bad(exc.field, exc.message, exc.status) from None
    messages: list[Message] = []
    called: set[str] = set()
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or set(message) - {"role", "content"}:
            raise bad(where, 'each message is {"role": "user" | "assistant", "content": …}')
        role, content = message.get("role"), message.get("content")
        if role == "system":  # Claude Code sends reminders so
            systems.append(_system(content, f"{where}.content"))
        elif role == "user":
            messages += _user(content, where, called)
        elif role == "assistant":
            assistant = _assistant(content, where)
            called |= {c.id for c in assistant.tool_calls}
            messages.append(assistant)
        else:
            raise bad(f"{where}.role", f"role must be user or assistant, got {role!r}")
    if not messages:
        raise bad("messages", "messages must hold a user message")
    return "\n\n".join(s for s in systems if s), tuple(messages)


def _size(message: Any) -> int:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return len(content)
    blocks = content if isinstance(content, list) else []
    return sum(
        len(json.dumps(b, ensure_ascii=False)) for b in blocks if isinstance(b, dict) and b.get("type") != "image"
    )


def _system(value: Any, where: str = "system") -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text_block(block, f"{where}[{j}]") for j, block in enumerate(value))
    raise bad(where, f"{where} must be a string or an array of text blocks")


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad(f"{where}.content", "content must be a string or an array of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad(f"{where}.content[{j}]", 'a content block is an object with a "type"')
    return content


def _text_block(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise bad(where, 'a text block is {"type": "text", "text": "…"}')
    return str(block["text"])


def _user(content: Any, where: str, called: set[str]) -> list[Message]:
    """A user turn: its tool results (each a tool message, in order), then its text and images."""
    texts: list[str] = []
    images: list[bytes] = []
    results: list[Message] = []
    for j, block in enumerate(_blocks(content, where)):
        at, kind = f"{where}.content[{j}]", block["type"]
        if kind == "text":
            texts.append(_text_block(block, at))
        elif kind == "image":
            images.append(_image(block, at))
        elif kind == "tool_result":
            results.append(_tool_result(block, at, called))
        elif kind == "document":
            raise bad(at, "document blocks are not supported: send the document's text as a text block")
        else:
            raise bad(at, f"a user message holds text, image and tool_result blocks, not {kind}")
    text = "\n".join(texts)
    return [*results, *([Message("user", text, images=tuple(images))] if text or images else [])]


def _image(block: dict[str, Any], where: str) -> bytes:
    from llmrun.api.images import BadImage, from_base64

    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "url":
        raise bad(f"{where}.source", "image URLs are not fetched on this route: send the image as base64")
    if kind != "base64" or not isinstance(source, dict) or not isinstance(source.get("data"), str):
        raise bad(
            f"{where}.source", 'an image is {"type": "image", "source": {"type": "base64", "media_type", "data"}}'
        )
    try:
        return from_base64(source["data"])
    except BadImage as exc:
        raise bad(f"{where}.source", str(exc)) from None


def _tool_result(block: dict[str, Any], where: str, called: set[str]) -> Message:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or call_id not in called:
        raise bad(f"{where}.tool_use_id", "a tool_result answers a tool_use of an earlier assistant message by its id")
    content = block.get("content", "")
    if isinstance(content, list):
        parts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        if len(parts) != len(content) and any(not isinstance(b, dict) or b.get("type") != "image" for b in content):
            raise bad(f"{where}.content", "a tool_result's content is a string or text (and image) blocks")
        content = "\n".join(str(p) for p in parts if isinstance(p, str))
    if not isinstance(content, str):
        raise bad(f"{where}.content", "a tool_result's content is a string or text blocks")
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return Message("tool", content, tool_call_id=call_id)


def _assistant(content: Any, where: str) -> Message:
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[str] = []
    for j, block in enumerate(_blocks(content, where)):
        at, kind = f"{where}.content[{j}]", block["type"]
        if kind == "text":
            texts.append(_text_block(block, at))
        elif kind == "tool_use":
            name, ident, arguments = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(ident, str) or not isinstance(arguments, dict):
                raise bad(at, 'a tool_use block is {"type": "tool_use", "id", "name", "input": {…}}')
            calls.append(ToolCall(ident, name, json.dumps(arguments, ensure_ascii=False)))
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
        elif kind in ("redacted_thinking", "server_tool_use", "web_search_tool_result"):
            continue  # another model's encrypted reasoning, or a server tool's trace: nothing to show this one
        else:
            raise bad(at, f"an assistant message holds text, tool_use and thinking blocks, not {kind}")
    return Message("assistant", "".join(texts), tuple(calls), reasoning="\n".join(reasoning) or None)


def _tools(value: Any, choice: Any) -> tuple[ToolUse | None, tuple[str, ...]]:
    """The client's tools (server tools such as web search are left out, by name), and how to use them."""
    if value is None or value == []:
        if choice not in (None, {"type": "auto"}, {"type": "none"}):
            raise bad("tool_choice", "tool_choice needs tools")
        return None, ()
    if not isinstance(value, list):
        raise bad("tools", "tools must be an array")
    tools: list[Tool] = []
    skipped: list[str] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise bad(where, "a tool is an object")
        if tool.get("type") not in (None, "custom"):  # a server tool (web_search_…, bash_…, code_execution_…)
            skipped.append(str(tool.get("name") or tool.get("type")))
            continue
        try:
            name = limits.tool_name(tool.get("name"), f"{where}.name")
            schema = tool.get("input_schema")
            if not isinstance(schema, dict):
                raise limits.OverLimit(f"{where}.input_schema", "input_schema must be a JSON Schema object")
            text = json.dumps(schema, ensure_ascii=False)
            limits.schema_size(text, f"{where}.input_schema")
        except limits.OverLimit as exc:
            raise bad(exc.field, exc.message, exc.status) from None
        description = tool.get("description", "")
        if not isinstance(description, str):
            raise bad(f"{where}.description", "description must be a string")
        tools.append(Tool(name, description, text))
    if not tools:
        return None, tuple(skipped)
    try:
        limits.tool_count(len(tools))
        limits.tool_names([t.name for t in tools])
    except limits.OverLimit as exc:
        raise bad(exc.field, exc.message, exc.status) from None
    return _choice(tuple(tools), choice), tuple(skipped)


def _choice(tools: tuple[Tool, ...], choice: Any) -> ToolUse:
    if choice is None:
        return ToolUse(tools, "auto")
    kind = choice.get("type") if isinstance(choice, dict) else None
    parallel = not (isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True)
    if kind == "auto":
        return ToolUse(tools, "auto", parallel=parallel)
    if kind == "any":
        return ToolUse(tools, "required", parallel=parallel)
    if kind == "none":
        return ToolUse(tools, "none")
    if kind == "tool":
        name = choice.get("name") if isinstance(choice, dict) else None
        if name not in {t.name for t in tools}:
            raise bad("tool_choice.name", f"tool_choice names {name!r}, which is not among the tools")
        return ToolUse(tools, "function", name, parallel=parallel)
    raise bad("tool_choice", 'tool_choice must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": …}')


# --- answers -------------------------------------------------------------------------------------------


def new_id(prefix: str = "msg_") -> str:
    return prefix + uuid.uuid4().hex[:24]


def stop_reason(result: Result, stop_sequences: tuple[str, ...]) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for a result."""
    if result.tool_calls:
        return "tool_use", None
    if result.finish_reason == "stop" and result.stop_string in stop_sequences:
        return "stop_sequence", result.stop_string
    return STOP_REASON[result.finish_reason], None


def usage(result: Result) -> dict[str, Any]:
    """Input tokens as Anthropic counts them: those read from the prefix cache apart."""
    return {
        "input_tokens": result.prompt_tokens - result.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": result.cached_tokens,
        "output_tokens": result.generated_tokens,
    }


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": tool_id(call.id), "name": call.name, "input": arguments}


def tool_id(ident: str) -> str:
    return ident if ident.startswith("toolu_") else "toolu_" + ident.removeprefix("call_")


def content_blocks(result: Result) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if result.reasoning:
        blocks.append({"type": "thinking", "thinking": result.reasoning, "signature": ""})
    text = result.content if result.content is not None or result.tool_calls else result.text
    if text:
        blocks.append({"type": "text", "text": text})
    blocks += [tool_use_block(call) for call in result.tool_calls]
    return blocks


def message_body(result: Result, ident: str, model: str, stop_sequences: tuple[str, ...]) -> dict[str, Any]:
    reason, sequence = stop_reason(result, stop_sequences)
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(result),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(result),
    }
