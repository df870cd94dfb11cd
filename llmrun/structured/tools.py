"""Tool calls: the functions a model may call, what a request asks of them, and the shared parts of
every dialect's grammar (pure: the grammar is text for llguidance).

How each model family writes a call is its dialect (:mod:`llmrun.structured.dialects`, chosen from the
chat template). ``tool_choice: required`` or a named function constrains the answer to calls (of that
function) with arguments matching its parameters; ``auto`` lets the model choose between text and calls,
and a call it starts is constrained as well; ``none`` keeps the tools in the prompt (the conversation may
refer to earlier calls) and the answer to text. Nothing is left to hope.
"""

from __future__ import annotations

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


def grammar_with_text(use: ToolUse, calls: str, rules: list[str], text: str, answer: Format | None) -> Format:
    """A Lark grammar whose start is ``calls``, or (auto, none) the text an answer may be instead: free text
    that ``text`` (a TEXT lexeme) bounds, or with ``answer`` a JSON document in that format."""
    lines = [f"start: {calls}", *rules]
    if use.mode in ("auto", "none"):
        symbol = "TEXT" if answer is None else "answer"
        lines[0] = f"start: {symbol}" if use.mode == "none" else f"start: {symbol} | {calls}"
        lines.append(text if answer is None else f"answer: {_json(declared_only(answer.schema()))}")
    return Format("lark", "\n".join(lines))
