"""Tool calls read while they are generated (pure): each call's name as soon as it is written, then its
arguments' JSON text in fragments, as OpenAI streams ``delta.tool_calls`` — for every dialect.

A family's own syntax is read by its dialect as the answer grows (:meth:`Dialect.progress`): the
arguments so far are JSON text whose every prefix starts the next (as generated for JSON arguments; for
arguments written one by one, the object of those complete so far, closed when the call ends), so the
fragments joined are the call's arguments as :meth:`Dialect.parse` reads them. The generic dialect's
``{"tool_calls": [{"name": …, "arguments": …}]}`` is followed by a scanner of JSON's nesting and strings,
one character at a time and never twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmrun.structured.dialects.base import Dialect
    from llmrun.structured.tools import Tool

GENERIC_DEPTH = 3  # where a generic call object sits: how many JSON containers are open once its own "{" is


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


class CallStream:
    """Feed it the answer's text as it grows (:meth:`advance`); it returns what the new text adds.
    ``tools`` type the arguments of dialects that write them one by one, as the whole answer's are."""

    def __init__(self, dialect: Dialect, tools: Sequence[Tool] = ()) -> None:
        self.dialect = dialect
        self.tools = tuple(tools)
        self._generic = _GenericScanner() if dialect.syntax is None else None
        self._names = 0
        self._sent: list[int] = []

    @property
    def calls(self) -> int:
        """Calls whose name was seen."""
        return self._generic.calls if self._generic is not None else self._names

    def advance(self, text: str) -> list[CallStart | ArgumentsText]:
        """``text``: the whole answer so far (it only grows)."""
        if self._generic is not None:
            return self._generic.advance(text)
        events: list[CallStart | ArgumentsText] = []
        for index, progress in enumerate(self.dialect.progress(text, self.tools)):
            if progress.name is None:
                break
            if index >= self._names:
                events.append(CallStart(index, progress.name))
                self._names += 1
                self._sent.append(0)
            grown = progress.arguments[self._sent[index] :]
            if grown:
                events.append(ArgumentsText(index, grown))
                self._sent[index] = len(progress.arguments)
        return events


@dataclass(slots=True)
class _GenericScanner:
    """The generic dialect's calls, found by following JSON's nesting."""

    arguments_key: str = "arguments"
    calls: int = 0  # calls whose name was seen
    _position: int = 0
    _stack: list[_Frame] = field(default_factory=list)
    _string_from: int | None = None  # where the string being read opened (None: not in a string)
    _escaped: bool = False
    _expect_key: bool = False
    _arguments: int | None = None  # where the streamed arguments value began (None: not in one)
    _arguments_depth: int = 0
    _sent: int = 0  # how far the arguments were sent

    def advance(self, text: str) -> list[CallStart | ArgumentsText]:
        events: list[CallStart | ArgumentsText] = []
        depth = GENERIC_DEPTH
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
