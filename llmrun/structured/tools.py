"""Tool calls: the functions a model may call, what a request asks of them, and the shared parts of
every dialect's grammar (pure: the grammar is text for llguidance).

How each model family writes a call is its dialect (:mod:`llmrun.structured.dialects`, chosen from the
chat template). ``tool_choice: required`` or a named function constrains the answer to calls (of that
function) with arguments matching its parameters; ``auto`` lets the model choose between text and calls,
and a call it starts is constrained as well; ``none`` keeps the tools in the prompt (the conversation may
refer to earlier calls) and the answer to text. Nothing is left to hope.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llmrun.prompt.template import Message
from llmrun.structured.formats import Format, declared_only

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


def calls_schema(use: ToolUse, arguments_key: str = "arguments") -> dict[str, Any]:
    """One call (a named function, or parallel_tool_calls false), else one to MAX_PARALLEL_CALLS."""
    items = call_schema(use.callable(), arguments_key)
    single = not use.parallel or use.mode == "function"
    return {"type": "array", "items": items, "minItems": 1, "maxItems": 1 if single else MAX_PARALLEL_CALLS}


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(schema, ensure_ascii=False)


def text_without(marker: str) -> str:
    """A Lark lexeme: any non-empty text that never writes ``marker`` (a call it starts must be the
    constrained kind: an answer is text, or calls)."""
    return f"TEXT: /(?s:.+)/ & ~/(?s:.*{re.escape(marker)}.*)/"


# --- the answer: calls, or text ---------------------------------------------------------------------


def uses_tools(messages: Sequence[Message]) -> bool:
    """Whether a conversation holds earlier calls or tool results."""
    return any(m.tool_calls or m.role == "tool" for m in messages)


def named_results(messages: Sequence[Message]) -> list[Message]:
    """The conversation with each tool result's function name filled in from the call it answers
    (OpenAI's tool messages carry only ``tool_call_id``; templates such as Gemma 4's, Kimi's and gpt-oss's
    write the function's name with its result)."""
    names: dict[str, str] = {}
    out: list[Message] = []
    for message in messages:
        names.update((c.id, c.name) for c in message.tool_calls)
        if message.role == "tool" and message.name is None and message.tool_call_id in names:
            message = dataclasses.replace(message, name=names[message.tool_call_id])
        out.append(message)
    return out


def grammar_with_text(use: ToolUse, calls: str, rules: list[str], text: str, answer: Format | None) -> Format:
    """A Lark grammar whose start is ``calls``, or (auto, none) the text an answer may be instead: free text
    that ``text`` (a TEXT lexeme) bounds, or with ``answer`` a JSON document in that format."""
    lines = [f"start: {calls}", *rules]
    if use.mode in ("auto", "none"):
        symbol = "TEXT" if answer is None else "answer"
        lines[0] = f"start: {symbol}" if use.mode == "none" else f"start: {symbol} | {calls}"
        lines.append(text if answer is None else f"answer: {_json(declared_only(answer.schema()))}")
    return Format("lark", "\n".join(lines))


def reasoning_first(fmt: Format, close: str, marker: Marker, open_: str | None = None) -> Format:
    """A tool grammar that lets a reasoning model reason first: free text up to its ``close`` marker (the
    prompt opened the reasoning), or with ``open_`` an optional ``open_ … close`` block (the model may
    open it), then a few blanks, then the answer ``fmt`` allows. Without it the grammar would force the
    calls inside the reasoning, where they are not read as calls."""
    lines = fmt.text.split("\n")
    if fmt.kind != "lark" or not lines[0].startswith("start: "):
        return fmt
    lines[0] = "answered: " + lines[0].removeprefix("start: ")
    for number, line in enumerate(lines):  # text after the reasoning starts after the blanks
        if line.startswith("TEXT: /(?s:.+)/"):
            line = "TEXT: /(?s:\\S.*)/" + line.removeprefix("TEXT: /(?s:.+)/")
            lines[number] = line + (f" & ~/(?s:{re.escape(open_)}.*)/" if open_ else "")
    spelled = marker(close)
    if spelled.startswith("<["):  # a special token: text cannot write it, so the text ends there
        reasoning = [f"reasoning: REASONING {spelled}", "REASONING: /(?s:.*)/"]
    else:
        reasoning = [f"reasoning[suffix={json.dumps(close, ensure_ascii=False)}]: /(?s:.*)/"]
    head = "start: reasoning gap answered"
    if open_ is not None:
        head = "start: opened gap answered | gap answered"
        reasoning.append(f"opened: {marker(open_)} reasoning")
    return Format("lark", "\n".join([head, *reasoning, "gap: /[ \\t\\r\\n]{0,4}/", *lines]))
