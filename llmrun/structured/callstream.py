"""Tool calls read while they are generated (pure): each call's name as soon as it is written, then its
arguments' JSON text in fragments, as OpenAI streams ``delta.tool_calls``.

The calls' shape is the one the dialect's grammar makes (:mod:`llmrun.structured.tools`): objects
``{"name": …, "arguments": …}`` (Llama 3: ``"parameters"``) at a depth fixed by the dialect — one per
``<tool_call>`` (Hermes), the top level (Llama 3), inside ``[TOOL_CALLS][…]`` (Mistral) or inside
``{"tool_calls": […]}`` (the generic one). A scanner that follows JSON's nesting and strings, one
character at a time and never twice, finds them; what lies between JSON values (the markers) is passed
over. The fragments joined are the arguments exactly as generated (valid JSON once the call is whole).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from llmrun.structured.tools import Dialect

# where a call object sits: how many JSON containers are open once its own "{" is
CALL_DEPTH = {"hermes": 1, "llama3": 1, "mistral": 2, "generic": 3}


@dataclass(frozen=True, slots=True)
class CallStart:
    """A call whose name has been written (``index``: its place among the answer's calls)."""

    index: int
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsText:
    """More of a call's arguments, as generated."""

    index: int
    text: str


@dataclass(slots=True)
class _Frame:
    kind: str  # "{" or "["
    call: bool = False  # an object at the dialect's call depth
    key: str | None = None  # the key whose value comes next (objects)
    name: str | None = None


@dataclass(slots=True)
class CallStream:
    """Feed it the answer's text as it grows (:meth:`advance`); it returns what the new text adds."""

    dialect: Dialect
    arguments_key: str = ""
    calls: int = 0  # calls whose name was seen
    _position: int = 0
    _stack: list[_Frame] = field(default_factory=list)
    _string_from: int | None = None  # where the string being read opened (None: not in a string)
    _escaped: bool = False
    _expect_key: bool = False
    _arguments: int | None = None  # where the streamed arguments value began (None: not in one)
    _arguments_depth: int = 0
    _sent: int = 0  # how far the arguments were sent

    def __post_init__(self) -> None:
        self.arguments_key = self.arguments_key or ("parameters" if self.dialect.name == "llama3" else "arguments")

    def advance(self, text: str) -> list[CallStart | ArgumentsText]:
        """``text``: the whole answer so far (it only grows)."""
        events: list[CallStart | ArgumentsText] = []
        depth = CALL_DEPTH[self.dialect.name]
        while self._position < len(text):
            char = text[self._position]
            if self._string_from is not None:
                self._in_string(text, char, events, depth)
            elif char == '"':
                self._begin_arguments(depth)
                self._string_from = self._position
            elif char in "{[":
                self._begin_arguments(depth)
                self._stack.append(_Frame(char, call=char == "{" and len(self._stack) + 1 == depth))
                self._expect_key = char == "{"
            elif char in "}]":
                self._after_value(text, events, end=self._position)  # a bare value ends before it
                if self._stack:
                    self._stack.pop()
                self._after_value(text, events, end=self._position + 1)  # a container value ends with it
            elif char == ":":
                self._expect_key = False
            elif char == ",":
                self._expect_key = bool(self._stack) and self._stack[-1].kind == "{"
                self._after_value(text, events, end=self._position)
            elif not char.isspace():
                self._begin_arguments(depth)  # a bare value (a number, true, null) as the arguments: rare
            self._position += 1
        if self._arguments is not None and len(text) > self._sent:
            end = len(text)
            events.append(ArgumentsText(self.calls - 1, text[self._sent : end]))
            self._sent = end
        return events

    def _in_string(self, text: str, char: str, events: list[CallStart | ArgumentsText], depth: int) -> None:
        if self._escaped:
            self._escaped = False
            return
        if char == "\\":
            self._escaped = True
            return
        if char != '"':
            return
        start, self._string_from = self._string_from, None
        assert start is not None
        frame = self._stack[-1] if self._stack else None
        if frame is None or frame.kind != "{" or (self._arguments is not None and len(self._stack) > depth):
            return
        value = _decoded(text[start : self._position + 1])
        if self._expect_key:
            frame.key = value
        elif frame.call and frame.key == "name" and frame.name is None and len(self._stack) == depth:
            frame.name = value
            events.append(CallStart(self.calls, value))
            self.calls += 1

    def _begin_arguments(self, depth: int) -> None:
        """Where a value begins: when it is a call's arguments, they are streamed from here."""
        frame = self._stack[-1] if self._stack else None
        if (
            self._arguments is None
            and frame is not None
            and frame.call
            and len(self._stack) == depth
            and frame.name is not None
            and frame.key == self.arguments_key
            and not self._expect_key
        ):
            self._arguments = self._sent = self._position
            self._arguments_depth = depth
            frame.key = None  # (its value is being read)

    def _after_value(self, text: str, events: list[CallStart | ArgumentsText], end: int) -> None:
        """A container closed or a comma came: the arguments end when their depth is back to the call's."""
        if self._arguments is None or len(self._stack) != self._arguments_depth:
            return
        if end > self._sent:
            events.append(ArgumentsText(self.calls - 1, text[self._sent : end]))
        self._arguments = None
        self._sent = end


def _decoded(raw: str) -> str:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw[1:-1]
    return value if isinstance(value, str) else raw[1:-1]
