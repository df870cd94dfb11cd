"""OpenAI's structured-output and tool fields in, engine terms out; tool calls out as OpenAI shapes (pure).

``response_format`` (``text``, ``json_object``, ``json_schema``), ``tools`` (functions with JSON Schema
parameters), ``tool_choice`` (``auto``, ``none``, ``required``, or a named function),
``parallel_tool_calls``, assistant messages carrying ``tool_calls`` and ``tool`` messages answering
them, all checked field by field against OpenAI's API reference: a malformed one is a 400 naming it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llmrun.api import limits
from llmrun.api.errors import bad_field, over_limit
from llmrun.errors import InvalidParameter
from llmrun.prompt.template import ToolCall
from llmrun.structured.formats import Format, from_schema, response_format
from llmrun.structured.tools import Tool, ToolUse

JSON_OBJECT = from_schema({"type": "object"})  # OpenAI's json_object mode answers an object


def parse_response_format(body: dict[str, Any]) -> Format | None:
    value = body.get("response_format")
    if value is None:
        return None
    try:
        fmt = response_format(value)
    except InvalidParameter as exc:
        raise bad_field(exc.name, f"{exc.name} must be {exc.expected}") from None
    return JSON_OBJECT if fmt is not None and fmt.kind == "json" else fmt


def parse_tools(body: dict[str, Any]) -> ToolUse | None:
    """The request's tools and tool_choice (None: no tools)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_field("parallel_tool_calls", "parallel_tool_calls must be a boolean", "invalid_type")
    if raw is None:
        if choice not in (None, "none"):
            raise bad_field("tool_choice", "tool_choice needs tools")
        return None
    if not isinstance(raw, list):
        raise bad_field("tools", f"tools must be an array of 1 to {limits.MAX_TOOLS} tools", "invalid_type")
    try:
        limits.tool_count(len(raw))
        tools = tuple(_tool(value, f"tools[{i}]") for i, value in enumerate(raw))
        names = [t.name for t in tools]
        limits.tool_names(names)
    except limits.OverLimit as exc:
        raise over_limit(exc) from None
    if choice in (None, "auto"):
        return ToolUse(tools, "auto", parallel=parallel)
    if choice == "none":
        return ToolUse(tools, "none", parallel=parallel)
    if choice == "required":
        return ToolUse(tools, "required", parallel=parallel)
    name = _chosen(choice)
    if name not in names:
        raise bad_field("tool_choice", f"tool_choice names {name!r}, which is not among the tools")
    return ToolUse(tools, "function", name, parallel=parallel)


def _tool(value: Any, where: str) -> Tool:
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(value.get("function"), dict):
        raise bad_field(where, f'{where} must be {{"type": "function", "function": {{...}}}}', "invalid_type")
    function = value["function"]
    extra = set(function) - {"name", "description", "parameters", "strict"}
    if extra:
        raise bad_field(f"{where}.function.{sorted(extra)[0]}", "unknown field of a function", "unknown_parameter")
    name = limits.tool_name(function.get("name"), f"{where}.function.name")
    description = function.get("description", "")
    if not isinstance(description, str):
        raise bad_field(f"{where}.function.description", "description must be a string", "invalid_type")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise bad_field(f"{where}.function.parameters", "parameters must be a JSON Schema object", "invalid_type")
    text = json.dumps(parameters, ensure_ascii=False)
    limits.schema_size(text, f"{where}.function.parameters")
    return Tool(name, description, text)


def _chosen(choice: Any) -> str:
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if isinstance(name, str) and name:
            return name
    raise bad_field(
        "tool_choice", 'tool_choice must be auto, none, required or {"type": "function", "function": {"name": ...}}'
    )


def parse_tool_calls(value: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls`` (sent back with the conversation)."""
    if not isinstance(value, list):
        raise bad_field(where, f"{where} must be an array", "invalid_type")
    calls = []
    for i, call in enumerate(value):
        at = f"{where}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise bad_field(at, f'{at} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
        name, arguments = function.get("name"), function.get("arguments", "{}")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise bad_field(f"{at}.function", "a call's name and arguments are strings", "invalid_type")
        calls.append(ToolCall(call["id"], name, arguments))
    return tuple(calls)


def tool_calls_json(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def tool_call_deltas(calls: Sequence[ToolCall], first: int = 0) -> list[list[dict[str, Any]]]:
    """The ``delta.tool_calls`` of streamed chunks, as OpenAI streams them: each call's id and name with
    empty arguments, then its arguments (``first``: the index of the first of ``calls``)."""
    deltas = []
    for index, c in enumerate(calls, start=first):
        head = {"index": index, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}
        deltas += [[head], [{"index": index, "function": {"arguments": c.arguments}}]]
    return deltas
