"""The Responses API's input (pure): ``input`` as items, each with an id, and the items (earlier responses'
included) as the engine's chat messages."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from llmrun.api import limits
from llmrun.api.errors import bad_field, over_limit
from llmrun.prompt.template import Message, ToolCall

SEPARATOR = "__"  # a namespace's function as the model sees it: namespace__name


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


# --- the conversation ----------------------------------------------------------------------------------

ITEM_KINDS = ("message", "function_call", "function_call_output", "reasoning")


def input_items(value: Any) -> tuple[dict[str, Any], ...]:
    """``input`` as items, each with an id and a type (a string is one user message)."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if not isinstance(value, list) or not value:
        raise bad_field("input", "input must be a string or a non-empty array of items", "missing_required")
    try:
        limits.message_count(len(value), "input")
        limits.prompt_size([len(json.dumps(v, ensure_ascii=False)) for v in value if not _has_image(v)], "input")
    except limits.OverLimit as exc:
        raise over_limit(exc) from None
    items = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad_field(f"input[{i}]", "an input item is an object", "invalid_type")
        kind = item.get("type", "message")
        if kind not in ITEM_KINDS:
            raise bad_field(f"input[{i}].type", f"input items are {', '.join(ITEM_KINDS)}; not {kind}")
        prefix = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}[kind]
        ident = item.get("id") if isinstance(item.get("id"), str) else new_id(prefix)
        normal = {**item, "type": kind, "id": ident}
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            normal["content"] = [{"type": part, "text": item["content"]}]
        items.append(normal)
    return tuple(items)


def _has_image(item: Any) -> bool:
    content = item.get("content") if isinstance(item, dict) else None
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "input_image" for p in content)


def conversation(
    instructions: str, items: tuple[dict[str, Any], ...], names: dict[str, tuple[str, str]], images: bool = True
) -> tuple[Message, ...]:
    """The items as chat messages: the instructions and every system or developer message folded into one
    system prompt at the start (many chat templates refuse a system turn later), function calls on the
    assistant message they follow, reasoning on the assistant message it precedes."""
    flat = {v: k for k, v in names.items()}
    systems = [instructions] if instructions else []
    messages: list[Message] = []
    called: set[str] = set()
    reasoning: list[str] = []
    for i, item in enumerate(items):
        where, kind = f"input[{i}]", item["type"]
        if kind == "reasoning":
            reasoning.append(_reasoning_text(item, where))
        elif kind == "message":
            role = item.get("role")
            text, pictures = _content(item.get("content"), f"{where}.content", role, images)
            if role in ("system", "developer"):
                systems.append(text)
            elif role == "user":
                messages.append(Message("user", text, images=pictures))
            elif role == "assistant":
                messages.append(Message("assistant", text, reasoning="\n".join(reasoning) or None))
                reasoning = []
            else:
                raise bad_field(f"{where}.role", f"role must be user, assistant, system or developer, got {role!r}")
        elif kind == "function_call":
            call = _call(item, where, flat)
            called.add(call.id)
            last = messages[-1] if messages else None
            if last is None or last.role != "assistant" or reasoning:
                last = Message("assistant", "", reasoning="\n".join(reasoning) or None)
                messages.append(last)
                reasoning = []
            messages[-1] = dataclasses.replace(last, tool_calls=(*last.tool_calls, call))
        else:
            messages.append(_output(item, where, called))
    if not any(m.role == "user" for m in messages):
        raise bad_field("input", "input must hold a user message")
    system = "\n\n".join(s for s in systems if s)
    return ((Message("system", system),) if system else ()) + tuple(messages)


def _content(value: Any, where: str, role: Any, images: bool) -> tuple[str, tuple[bytes, ...]]:
    from llmrun.api.images import BadImage, from_url

    if not isinstance(value, list):
        raise bad_field(where, f"{where} must be a string or an array of content parts", "invalid_type")
    texts: list[str] = []
    pictures: list[bytes] = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind == "input_image" and role == "user":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise bad_field(at, "an input_image needs an image_url (a data: URL); file_id is not supported")
            if not images:
                raise bad_field(at, "this model does not read images")
            try:
                pictures.append(from_url(url))
            except BadImage as exc:
                raise bad_field(f"{at}.image_url", str(exc), "invalid_image") from None
        elif kind in ("input_file", "input_audio", "input_image"):
            raise bad_field(at, f"{kind} parts are not supported here (images go in user messages)")
        else:
            raise bad_field(at, 'a content part is {"type": "input_text" | "output_text", "text": "…"}')
    return "".join(texts), tuple(pictures)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """Earlier reasoning: its text (``content``), else its summary; encrypted content is another model's."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise bad_field(where, "a reasoning item's summary and content are arrays of text parts")
    return "\n".join(p["text"] for p in parts if isinstance(p.get("text"), str))


def _call(item: dict[str, Any], where: str, flat: dict[tuple[str, str], str]) -> ToolCall:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise bad_field(where, 'a function_call is {"type": "function_call", "call_id", "name", "arguments": "…"}')
    space = item.get("namespace")
    if isinstance(space, str):
        name = flat.get((space, name), f"{space}{SEPARATOR}{name}")
    return ToolCall(call_id, name, arguments)


def _output(item: dict[str, Any], where: str, called: set[str]) -> Message:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or call_id not in called:
        raise bad_field(
            f"{where}.call_id", "a function_call_output answers a function_call of the input by its call_id"
        )
    output = item.get("output")
    if isinstance(output, list):
        output = "\n".join(p["text"] for p in output if isinstance(p, dict) and isinstance(p.get("text"), str))
    if not isinstance(output, str):
        raise bad_field(f"{where}.output", "a function_call_output's output is a string or text parts")
    return Message("tool", output, tool_call_id=call_id)
