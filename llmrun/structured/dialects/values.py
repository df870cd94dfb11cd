"""Arguments written in a family's own value syntax, read as JSON values (pure): Python keyword
arguments (LFM2's ``get_weather(city='Paris', days=3)``) and Gemma 4's objects
(``{city:<|"|>Paris<|"|>,days:3}``). Each reader returns ``(value, end)``, None when the text ends
before the arguments do, and raises ValueError when they are not in that syntax."""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Iterator
from typing import Any

GEMMA_QUOTE = '<|"|>'
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
_PYTHON_WORDS = {"None": "null", "True": "true", "False": "false"}
_BARE = re.compile(r"[^\s,:{}\[\]<]+")


def python_keywords(text: str, position: int) -> tuple[dict[str, Any], int] | None:
    """``key=value, …`` up to the ``)`` that closes the call (not consumed), values as Python literals."""
    end = _closing_paren(text, position)
    if end is None:
        return None
    body = _escaped_newlines(text[position:end])
    try:
        with warnings.catch_warnings():  # (a string's backslashes are its own, not Python's escapes)
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            call = ast.parse(f"f({body})", mode="eval").body
    except SyntaxError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(call, ast.Call) or call.args:
        raise ValueError("keyword arguments only")
    values: dict[str, Any] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise ValueError("no ** arguments")
        values[keyword.arg] = _plain(ast.literal_eval(keyword.value))
    return values, end


def python_literal(value: Any) -> str:
    """A JSON value as a Python literal (how LFM2's template writes arguments)."""
    return repr(value)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _quoting(text: str, start: int = 0) -> Iterator[tuple[int, str, bool]]:
    """Each character of ``text`` from ``start``, and whether it lies inside a quoted Python string
    (its quotes count as outside: a quote opens or closes)."""
    quote, escaped = "", False
    for index in range(start, len(text)):
        char = text[index]
        inside = bool(quote) and not (char == quote and not escaped)
        yield index, char, inside
        if quote:
            escaped = not escaped and char == "\\"
            if char == quote and not inside:
                quote = ""
        elif char in "'\"":
            quote = char


def _escaped_newlines(body: str) -> str:
    """Raw new lines inside quoted strings escaped (templates write a string's new lines as they are)."""
    return "".join("\\n" if inside and char == "\n" else char for _, char, inside in _quoting(body))


def _closing_paren(text: str, position: int) -> int | None:
    depth = 0
    for index, char, inside in _quoting(text, position):
        if inside or char in "'\"":
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return index if char == ")" else None
            depth -= 1
    return None


def gemma_object(text: str, position: int) -> tuple[dict[str, Any], int] | None:
    """Gemma 4's ``{key:value,…}``: bare keys, strings between ``<|"|>`` marks, nested objects and
    lists, numbers, ``true``/``false``/``null``; the end is after the closing ``}``."""
    if position >= len(text):
        return None
    if text[position] != "{":
        raise ValueError("an object starts with {")
    out: list[str] = []
    depth = 0
    index = position
    expect_key = False
    while index < len(text):
        if text.startswith(GEMMA_QUOTE, index):
            close = text.find(GEMMA_QUOTE, index + len(GEMMA_QUOTE))
            if close < 0:
                return None
            out.append(json.dumps(text[index + len(GEMMA_QUOTE) : close], ensure_ascii=False))
            index = close + len(GEMMA_QUOTE)
            expect_key = False
            continue
        if GEMMA_QUOTE.startswith(text[index:]) and text[index] == "<":
            return None  # a quote mark cut by the end of the text
        char = text[index]
        if char in "{[":
            depth += 1
            expect_key = char == "{"
            out.append(char)
        elif char in "}]":
            depth -= 1
            out.append(char)
            if depth == 0:
                value = json.loads("".join(out))
                if not isinstance(value, dict):
                    raise ValueError("the arguments are an object")
                return value, index + 1
            expect_key = False
        elif char == ",":
            out.append(char)
            expect_key = _in_object(out)
        elif char == ":":
            out.append(char)
            expect_key = False
        elif char.isspace():
            pass
        else:
            match = _BARE.match(text, index)
            if match is None:
                raise ValueError(f"unexpected {char!r}")
            word = match.group()
            if match.end() == len(text):
                return None
            if expect_key:
                out.append(json.dumps(word))
            else:
                word = _PYTHON_WORDS.get(word, word)  # (Gemma 4's template writes a null as None)
                if word not in ("true", "false", "null"):
                    float(word)  # a number (ValueError otherwise)
                out.append(word)
            index = match.end()
            continue
        index += 1
    return None


def _in_object(out: list[str]) -> bool:
    """Whether the innermost open container of the JSON written so far is an object."""
    depth = 0
    for piece in reversed(out):
        if piece in ("}", "]"):
            depth += 1
        elif piece in ("{", "["):
            if depth == 0:
                return piece == "{"
            depth -= 1
    return False
