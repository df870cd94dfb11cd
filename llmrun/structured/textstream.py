"""The text of an answer to a request with tools, shown while it streams (pure): held while the answer
may still become calls, then passed on (for the generic dialect, the string inside ``{"response": "…"}``,
decoded as it comes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from llmrun.structured.dialects.base import Dialect

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
        out = self._generic() if self.dialect.syntax is None else self._native()
        self.shown += out
        return out

    def _native(self) -> str:
        if self.state == "text":
            out, self.buffer = self.buffer, ""
            return out
        head = self.buffer.lstrip()
        starts = self.dialect.starts
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
