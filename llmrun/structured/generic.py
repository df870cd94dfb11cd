"""The generic dialect, for templates that know no tools (Gemma 3, Phi-3, SmolLM2): the tools described
in a system message, and the answer one JSON object — ``{"tool_calls": […]}`` or ``{"response": "…"}``
(the approach llama.cpp's server takes for such models)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from llmrun.prompt.template import Message, ToolCall
from llmrun.structured.formats import Format, from_schema
from llmrun.structured.tools import ToolUse, calls_schema


def generic_format(use: ToolUse, answer: Format | None) -> Format:
    """One JSON object: ``{"tool_calls": […]}``, or (auto, none) ``{"response": …}`` — a string, or with
    ``answer`` a document in that format."""
    calls = {
        "type": "object",
        "properties": {"tool_calls": calls_schema(use)},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    text = {
        "type": "object",
        "properties": {"response": answer.schema() if answer is not None else {"type": "string"}},
        "required": ["response"],
        "additionalProperties": False,
    }
    return from_schema({"auto": {"anyOf": [calls, text]}, "none": text}.get(use.mode, calls))


def _call(new_id: Callable[[], str], value: Any, arguments_key: str = "arguments") -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(new_id(), value["name"], text)


def _objects(text: str) -> list[Any]:
    """The JSON values in ``text``, one after another (blanks between them)."""
    decoder = json.JSONDecoder()
    values, position = [], 0
    while position < len(text):
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            break
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            break
        values.append(value)
    return values


def parse_generic(text: str, new_id: Callable[[], str]) -> tuple[str | None, tuple[ToolCall, ...]]:
    values = _objects(text)
    value = values[0] if values else None
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        calls = tuple(c for c in (_call(new_id, v) for v in value["tool_calls"]) if c)
        if calls:
            return None, calls
    if isinstance(value, dict) and isinstance(value.get("response"), str):
        return value["response"], ()
    if isinstance(value, dict) and set(value) == {"response"}:  # a JSON answer (response_format)
        return json.dumps(value["response"], ensure_ascii=False), ()
    return text, ()


# --- the conversation a generic model sees -------------------------------------------------------

GENERIC_INSTRUCTIONS = (
    "You can call these tools (JSON Schema for each one's arguments):\n{tools}\n\n"
    "Answer with one JSON object: "
    '{{"tool_calls": [{{"name": "<tool name>", "arguments": {{...}}}}]}} to call tools, '
    'or {{"response": "<your answer>"}} to answer directly.'
)


def generic_messages(messages: Sequence[Message], use: ToolUse | None) -> list[Message]:
    """The conversation for a model whose template knows no tools: the tools (if offered) described in
    the system message, earlier calls as the JSON the model answers with, tool results as one user
    turn per run of them (templates such as Gemma's insist that turns alternate)."""
    head: list[Message] = []
    if use is not None:
        described = GENERIC_INSTRUCTIONS.format(
            tools=json.dumps([t.openai()["function"] for t in use.tools], ensure_ascii=False, indent=1)
        )
        if messages and messages[0].role == "system":
            head = [Message("system", f"{messages[0].content}\n\n{described}")]
            messages = messages[1:]
        else:
            head = [Message("system", described)]
    out: list[Message] = []
    names: dict[str, str] = {}  # call id → function name, for results that do not say it
    after_tool = False
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            names.update((c.id, c.name) for c in message.tool_calls)
            calls = [{"name": c.name, "arguments": _loaded(c.arguments)} for c in message.tool_calls]
            out.append(Message("assistant", json.dumps({"tool_calls": calls}, ensure_ascii=False)))
        elif message.role == "tool":
            name = message.name or names.get(message.tool_call_id or "")
            response = {"name": name, "tool_call_id": message.tool_call_id, "content": message.content}
            result = json.dumps({"tool_response": response}, ensure_ascii=False)
            if after_tool:
                out[-1] = Message("user", f"{out[-1].content}\n{result}")
            else:
                out.append(Message("user", result))
        else:
            out.append(message)
        after_tool = message.role == "tool"
    return head + out


def _loaded(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
