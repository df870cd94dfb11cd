"""Tool calls: the functions a model may call, how each model family writes a call, and the grammar
that makes a call certain where one is required (pure: the grammar is text for llguidance).

A model family writes calls its own way, and its chat template says which (:func:`dialect_for`):

- ``hermes`` — Qwen 2.5/3, Hermes, SmolLM3: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``
- ``llama3`` — Llama 3.1/3.2/3.3: one bare ``{"name": …, "parameters": {…}}``
- ``mistral`` — Mistral 7B v0.3, Nemo, Small: ``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]``
- ``generic`` — any template that does not describe tools (Gemma 3, Phi-3, SmolLM2): the tools are
  described in a system message and the answer is one JSON object, ``{"tool_calls": […]}`` or
  ``{"response": "…"}`` (the approach llama.cpp's server takes for such models).

``tool_choice: required`` or a named function constrains the answer to calls (of that function) with
arguments matching its parameters; ``auto`` lets the model choose between text and calls, and a call it
starts is constrained as well; ``none`` keeps the tools in the prompt (the conversation may refer to
earlier calls) and the answer to text. Nothing is left to hope.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llmrun.errors import UsageError
from llmrun.prompt.template import Message, ToolCall
from llmrun.structured.formats import Format, declared_only, from_schema

Mode = Literal["auto", "required", "function", "none"]
Marker = Callable[[str], str]  # a marker's text → how the grammar spells it (a special token, or the text)


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call: ``parameters`` is its arguments' JSON Schema, as JSON text."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}}'

    def openai(self) -> dict[str, Any]:
        """The tool as OpenAI's API (and chat templates) describe it."""
        function: dict[str, Any] = {"name": self.name, "parameters": json.loads(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The tools a request offers and how the model must use them (``none``: it knows them, answers in text)."""

    tools: tuple[Tool, ...]
    mode: Mode = "auto"
    function: str | None = None  # mode "function": the one it must call
    parallel: bool = True  # may answer with several calls

    def callable(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.function is None or t.name == self.function)


# --- one call's JSON --------------------------------------------------------------------------


def call_schema(tools: Sequence[Tool], arguments_key: str = "arguments") -> dict[str, Any]:
    """A call of one of ``tools``: ``{"name": <its name>, "<arguments_key>": <its parameters>}``."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, arguments_key: declared_only(json.loads(t.parameters))},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


MAX_PARALLEL_CALLS = 8  # a small model asked for calls may otherwise repeat one until max_tokens


def _calls_schema(use: ToolUse, arguments_key: str = "arguments") -> dict[str, Any]:
    """One call (a named function, or parallel_tool_calls false), else one to MAX_PARALLEL_CALLS."""
    items = call_schema(use.callable(), arguments_key)
    single = not use.parallel or use.mode == "function"
    return {"type": "array", "items": items, "minItems": 1, "maxItems": 1 if single else MAX_PARALLEL_CALLS}


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(schema, ensure_ascii=False)


def _text_not_starting_with(prefix: str) -> str:
    """A Lark lexeme: any non-empty text that does not begin (after blanks) with ``prefix``."""
    return f"TEXT: /(?s:.+)/ & ~/(?s:\\s*{re.escape(prefix)}.*)/"


def _text_without(marker: str) -> str:
    """A Lark lexeme: any non-empty text that never writes ``marker`` (a call it starts must be the
    constrained kind: an answer is text, or calls)."""
    return f"TEXT: /(?s:.+)/ & ~/(?s:.*{re.escape(marker)}.*)/"


# --- dialects ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    native: bool  # the template renders the tools and the calls itself

    def format(self, use: ToolUse, marker: Marker, answer: Format | None = None) -> Format:
        """What the answer is constrained to: calls, or text (or, with ``answer``, a JSON document
        in that format: OpenAI's ``response_format`` beside ``tools``)."""
        if answer is not None and not answer.is_json:
            raise UsageError("with tools, `response_format` must be JSON", "drop the grammar, or the tools")
        return _FORMATS[self.name](use, marker, answer)

    def parse(self, text: str) -> tuple[str | None, tuple[ToolCall, ...]]:
        """An answer → its text (None when it is only calls) and its calls."""
        return _PARSERS[self.name](text, self)

    def new_id(self) -> str:
        if self.name == "mistral":  # Mistral's templates take exactly nine letters and digits
            return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
        return "call_" + secrets.token_hex(12)


HERMES = Dialect("hermes", True)
LLAMA3 = Dialect("llama3", True)
MISTRAL = Dialect("mistral", True)
GENERIC = Dialect("generic", False)


def uses_tools(messages: Sequence[Message]) -> bool:
    """Whether a conversation holds earlier calls or tool results."""
    return any(m.tool_calls or m.role == "tool" for m in messages)


def dialect_for(template: str) -> Dialect:
    """How the model behind ``template`` writes tool calls (generic when its template has no tools)."""
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|start_header_id|>" in template and ("<|python_tag|>" in template or "tools" in template):
        return LLAMA3
    return GENERIC


def _grammar(use: ToolUse, calls: str, rules: list[str], text: str, answer: Format | None) -> Format:
    """A Lark grammar whose start is ``calls``, or (auto, none) the text an answer may be instead: free text
    that ``text`` (a TEXT lexeme) bounds, or with ``answer`` a JSON document in that format."""
    lines = [f"start: {calls}", *rules]
    if use.mode in ("auto", "none"):
        symbol = "TEXT" if answer is None else "answer"
        lines[0] = f"start: {symbol}" if use.mode == "none" else f"start: {symbol} | {calls}"
        lines.append(text if answer is None else f"answer: {_json(declared_only(answer.schema()))}")
    return Format("lark", "\n".join(lines))


def _hermes_format(use: ToolUse, marker: Marker, answer: Format | None) -> Format:
    call = f'{marker("<tool_call>")} "\\n" {_json(call_schema(use.callable()))} "\\n" {marker("</tool_call>")}'
    single = not use.parallel or use.mode == "function"
    calls = "call" if single else f'call ("\\n" call)~0..{MAX_PARALLEL_CALLS - 1}'
    return _grammar(use, "calls", [f"calls: {calls}", f"call: {call}"], _text_without("<tool_call>"), answer)


def _llama3_format(use: ToolUse, marker: Marker, answer: Format | None) -> Format:
    call = _json(call_schema(use.callable(), "parameters"))  # Llama 3 templates take one call a turn
    return _grammar(use, "call", [f"call: {call}"], _text_not_starting_with("{"), answer)


def _mistral_format(use: ToolUse, marker: Marker, answer: Format | None) -> Format:
    calls = f"calls: {marker('[TOOL_CALLS]')} {_json(_calls_schema(use))}"
    return _grammar(use, "calls", [calls], _text_without("[TOOL_CALLS]"), answer)


def _generic_format(use: ToolUse, marker: Marker, answer: Format | None) -> Format:
    """One JSON object: ``{"tool_calls": […]}``, or (auto, none) ``{"response": …}`` — a string, or with
    ``answer`` a document in that format."""
    calls = {
        "type": "object",
        "properties": {"tool_calls": _calls_schema(use)},
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


_FORMATS: dict[str, Callable[[ToolUse, Marker, Format | None], Format]] = {
    "hermes": _hermes_format,
    "llama3": _llama3_format,
    "mistral": _mistral_format,
    "generic": _generic_format,
}


# --- reading calls back -------------------------------------------------------------------------


def _call(dialect: Dialect, value: Any, arguments_key: str = "arguments") -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(dialect.new_id(), value["name"], text)


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


_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _parse_hermes(text: str, dialect: Dialect) -> tuple[str | None, tuple[ToolCall, ...]]:
    calls = []
    for body in _HERMES_CALL.findall(text):
        for value in _objects(body):
            call = _call(dialect, value)
            if call is not None:
                calls.append(call)
    rest = _HERMES_CALL.sub("", text).strip()
    return (rest or None) if calls else text, tuple(calls)


def _parse_llama3(text: str, dialect: Dialect) -> tuple[str | None, tuple[ToolCall, ...]]:
    body = text.removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, ()
    calls = [c for c in (_call(dialect, v, "parameters") or _call(dialect, v) for v in _objects(body)) if c]
    return (None, tuple(calls)) if calls else (text, ())


def _parse_mistral(text: str, dialect: Dialect) -> tuple[str | None, tuple[ToolCall, ...]]:
    head, marker, body = text.partition("[TOOL_CALLS]")
    if not marker:  # [TOOL_CALLS] is a control token in Mistral's vocabularies: it shows as nothing
        head, body = "", text
    values = _objects(body)
    items = values[0] if values and isinstance(values[0], list) else values
    calls = tuple(c for c in (_call(dialect, v) for v in items) if c)
    return (head.strip() or None) if calls else text, calls


def _parse_generic(text: str, dialect: Dialect) -> tuple[str | None, tuple[ToolCall, ...]]:
    values = _objects(text)
    value = values[0] if values else None
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        calls = tuple(c for c in (_call(dialect, v) for v in value["tool_calls"]) if c)
        if calls:
            return None, calls
    if isinstance(value, dict) and isinstance(value.get("response"), str):
        return value["response"], ()
    if isinstance(value, dict) and set(value) == {"response"}:  # a JSON answer (response_format)
        return json.dumps(value["response"], ensure_ascii=False), ()
    return text, ()


_PARSERS: dict[str, Callable[[str, Dialect], tuple[str | None, tuple[ToolCall, ...]]]] = {
    "hermes": _parse_hermes,
    "llama3": _parse_llama3,
    "mistral": _parse_mistral,
    "generic": _parse_generic,
}


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


# --- streaming the text of an answer that may be calls ----------------------------------------------

_CALL_STARTS = {
    "hermes": ("<tool_call>",),
    "llama3": ("{", "<|python_tag|>"),
    "mistral": ("[TOOL_CALLS]", '[{"name"'),  # the marker is a control token: it may show as nothing
}
_GENERIC_TEXT = '{"response": "'
_GENERIC_CALLS = '{"tool_calls": '
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"'}


class TextStream:
    """The text of an answer to a request with tools, shown while it streams: nothing until the answer
    shows whether it is text or calls, then the text as it comes (for a template without tools, the
    string inside ``{"response": "…"}``, decoded). Once the answer shows it is calls, ``buffer`` holds its
    whole text as it grows (:class:`llmrun.structured.callstream.CallStream` reads the calls from it)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.buffer = ""
        self.state: Literal["undecided", "text", "calls", "done"] = "undecided"
        self.shown = ""  # all the text shown so far

    def feed(self, text: str) -> str:
        """More of the answer; the text to show now."""
        if self.state == "done":
            return ""
        self.buffer += text
        if self.state == "calls":  # (the buffer keeps the calls' text for structured.callstream)
            return ""
        out = self._generic() if self.dialect is GENERIC else self._native()
        self.shown += out
        return out

    def _native(self) -> str:
        if self.state == "text":
            out, self.buffer = self.buffer, ""
            return out
        head = self.buffer.lstrip()
        starts = _CALL_STARTS[self.dialect.name]
        if not head or any(s.startswith(head) for s in starts):
            return ""  # could still become a call
        if any(head.startswith(s) for s in starts):
            self.state = "calls"
            return ""
        self.state = "text"
        out, self.buffer = self.buffer, ""
        return out

    def _generic(self) -> str:
        if self.state == "undecided":
            if self.buffer.startswith(_GENERIC_TEXT):
                self.state, self.buffer = "text", self.buffer[len(_GENERIC_TEXT) :]
            elif self.buffer.startswith(_GENERIC_CALLS) or not (
                _GENERIC_TEXT.startswith(self.buffer) or _GENERIC_CALLS.startswith(self.buffer)
            ):
                self.state = "calls"  # (or not the shape the grammar makes: the end reads it whole)
                return ""
            else:
                return ""
        out, used, closed = json_string_prefix(self.buffer)
        self.buffer = self.buffer[used:]
        if closed:
            self.state = "done"
        return out


def json_string_prefix(raw: str) -> tuple[str, int, bool]:
    """The start of a JSON string's body decoded: (text, characters used, whether the string closed).
    An escape cut by the end of ``raw`` is left for the next call."""
    out: list[str] = []
    i = 0
    while i < len(raw):
        char = raw[i]
        if char == '"':
            return "".join(out), i + 1, True
        if char != "\\":
            out.append(char)
            i += 1
            continue
        if i + 1 >= len(raw):
            break
        kind = raw[i + 1]
        if kind != "u":
            out.append(_ESCAPES.get(kind, kind))
            i += 2
            continue
        if i + 6 > len(raw):
            break
        code = _hex(raw[i + 2 : i + 6])
        if 0xD800 <= code < 0xDC00:  # a surrogate pair: both halves first
            if i + 12 > len(raw):
                break
            low = _hex(raw[i + 8 : i + 12])
            out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
            i += 12
            continue
        out.append(chr(code))
        i += 6
    return "".join(out), i, False


def _hex(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        return 0xFFFD  # not JSON's escape (the grammar makes it so): shown as the replacement character
