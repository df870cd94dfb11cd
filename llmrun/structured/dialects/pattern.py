"""A tool-call pattern, and reading calls written in it (pure).

Every family writes a call as fixed text around a few slots, so one pattern string describes it, e.g.
Qwen3-Coder's ``<tool_call>\\n<function={name}>\\n{params}</function>\\n</tool_call>`` with the parameter
pattern ``<parameter={key}>\\n{value}\\n</parameter>\\n``. The same pattern is read here and written as a
grammar in :mod:`llmrun.structured.dialects.lark`.

Slots: ``{name}`` the function; ``{args}`` its arguments as a JSON object; ``{params}`` its arguments one
by one in the parameter pattern (``{key}``, ``{value}`` raw text, ``{typed}`` an attribute saying whether the
value is a string); ``{python}`` keyword arguments as Python literals (``city='Paris', days=3``);
``{gemma}`` Gemma 4's object (``{city:<|"|>Paris<|"|>,days:3}``); ``{id}`` and ``{index}`` free text the
template writes (a call id, a counter). Reading is lenient where writing is exact: any run of blanks in a
pattern matches any run (or none), and text that ends inside a closing literal (a stop token the engine
removed) still ends the call.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["lit", "name", "args", "params", "python", "gemma", "id", "index", "key", "value", "typed"]
SLOTS = ("name", "args", "params", "python", "gemma", "id", "index", "key", "value", "typed")
NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_SLOT = re.compile(r"\{(" + "|".join(SLOTS) + r")\}")
BLANKS = re.compile(r"\s+")
_WORD = re.compile(r"[^\s<>\"'=/\[\]|]*")


@dataclass(frozen=True, slots=True)
class Segment:
    kind: Kind
    text: str = ""  # a literal's text


@functools.lru_cache(maxsize=256)
def segments(pattern: str) -> tuple[Segment, ...]:
    """``pattern`` cut into literals and slots (``{{`` and ``}}`` are literal braces)."""
    out: list[Segment] = []
    position = 0
    for match in _SLOT.finditer(pattern):
        if match.start() > position:
            out.append(_literal_segment(pattern[position : match.start()]))
        out.append(Segment(match.group(1)))  # type: ignore[arg-type]
        position = match.end()
    if position < len(pattern):
        out.append(_literal_segment(pattern[position:]))
    return tuple(out)


def _literal_segment(text: str) -> Segment:
    return Segment("lit", text.replace("{{", "{").replace("}}", "}"))


@functools.lru_cache(maxsize=1024)
def literal_regex(text: str, *, before_value: bool = False, after_value: bool = False) -> str:
    """A literal as read: blanks in it match any blanks (or none) — except those that touch a raw
    value, which are its edges: each of them is optional, never more (a value's own indentation stays)."""
    head = len(text) - len(text.lstrip()) if after_value else 0
    tail = len(text) - len(text.rstrip()) if before_value else 0
    middle = text[head : len(text) - tail] if tail else text[head:]

    def exact(blanks: str) -> str:
        return "".join(f"(?:{re.escape(c)})?" for c in blanks)

    parts = BLANKS.split(middle)
    lenient = r"\s*".join(re.escape(p) for p in parts)
    return exact(text[:head]) + lenient + (exact(text[len(text) - tail :]) if tail else "")


@dataclass(slots=True)
class Progress:
    """How far a call has been read: its name once complete, its arguments (JSON text) so far."""

    name: str | None = None
    arguments: str = ""
    done: bool = False
    values: dict[str, Any] = field(default_factory=dict)


class Incomplete(Exception):
    """The text ended inside the pattern (streaming: more may come)."""


@dataclass(frozen=True, slots=True)
class Reader:
    """Reads one pattern at a position of a text. ``params`` is the parameter pattern; ``string_marks``
    the ``{typed}`` attribute's values for a string and for anything else; ``strip`` removes one new line
    around a parameter's value (templates that write values on their own line)."""

    pattern: tuple[Segment, ...]
    params: tuple[Segment, ...] = ()
    string_marks: tuple[str, str] = ("true", "false")
    strip: bool = False

    def match(
        self, text: str, position: int, types: dict[str, dict[str, Any]] | None, progress: Progress | None = None
    ) -> int | None:
        """Where the pattern ends when it starts at ``position`` (None: it does not). ``progress`` is
        filled as reading goes; :class:`Incomplete` when the text ends before the pattern does."""
        progress = progress if progress is not None else Progress()
        return self._segments(self.pattern, text, position, types or {}, progress, {})

    def _segments(
        self,
        pattern: tuple[Segment, ...],
        text: str,
        position: int,
        types: dict[str, dict[str, Any]],
        progress: Progress,
        seen: dict[str, str],
    ) -> int | None:
        for number, segment in enumerate(pattern):
            following = pattern[number + 1] if number + 1 < len(pattern) else None
            after_value = number > 0 and pattern[number - 1].kind == "value"
            end = self._segment(segment, following, text, position, types, progress, seen, after_value)
            if end is None:
                return None
            position = end
        return position

    def _segment(
        self,
        segment: Segment,
        following: Segment | None,
        text: str,
        position: int,
        types: dict[str, dict[str, Any]],
        progress: Progress,
        seen: dict[str, str],
        after_value: bool,
    ) -> int | None:
        kind = segment.kind
        if kind == "lit":
            before_value = following is not None and following.kind == "value"
            regex = literal_regex(segment.text, before_value=before_value, after_value=after_value)
            return _literal(segment.text, regex, text, position, following is None)
        if kind in seen:  # a slot written twice (MiniMax M3's </{key}>): the same text again
            return _literal(seen[kind], re.escape(seen[kind]), text, position, False)
        if kind == "name":
            match = NAME.match(text, position)
            if match is None or match.end() == len(text):
                if match is None and position < len(text):
                    return None
                raise Incomplete
            seen["name"] = progress.name = match.group()
            return match.end()
        if kind == "args":
            return _json_arguments(text, position, progress)
        if kind == "params":
            return self._parameters(text, position, types.get(seen.get("name", ""), {}), progress)
        if kind in ("python", "gemma"):
            return _scanned(kind, text, position, progress)
        if kind != "value":  # one word: a key, an id, an index, a type
            word = _WORD.match(text, position)
            assert word is not None
            if word.end() == len(text):
                raise Incomplete
            seen[kind] = word.group()
            return word.end()
        # a value: raw text up to the literal after it
        if following is None or following.kind != "lit":
            raise ValueError("a {value} slot must be followed by a literal")
        end = _value_end(following.text, text, position)
        if end is None:
            raise Incomplete  # (the literal after it may still come)
        seen[kind] = text[position:end]
        return end

    def _parameters(self, text: str, position: int, schema: dict[str, Any], progress: Progress) -> int:
        """Parameters one after another until the text stops matching the parameter pattern."""
        properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
        values: dict[str, Any] = {}
        progress.values = values
        while True:
            seen: dict[str, str] = {}
            scratch = Progress()
            try:
                end = self._segments(self.params, text, position, {}, scratch, seen)
            except Incomplete:
                if _could_start(self.params, text, position):
                    raise
                return position
            if end is None or "key" not in seen:
                return position
            values[seen["key"]] = self._typed(seen, properties.get(seen["key"]))
            progress.arguments = object_text(values, closed=False)
            position = end

    def _typed(self, seen: dict[str, str], schema: Any) -> Any:
        raw = seen.get("value", "")
        cdata = _CDATA.match(raw)  # XML's way to write text with markup in it (MiniCPM)
        raw = cdata.group(1) if cdata else raw
        if self.strip:
            raw = raw.removeprefix("\n").removesuffix("\n")
        if "typed" in seen:
            return raw if seen["typed"] == self.string_marks[0] else _loaded(raw)
        return typed_value(raw, schema)


def object_text(values: dict[str, Any], *, closed: bool) -> str:
    """Arguments read one by one, as the JSON object they make (open until the call ends): each prefix
    is the start of the next, so streamed fragments join to the whole."""
    items = ", ".join(
        f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}" for k, v in values.items()
    )
    return "{" + items + ("}" if closed else "")


def is_string(schema: Any) -> bool:
    """Whether a parameter's schema makes its value a string (written as raw text in XML dialects)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and kind and all(k in ("string", "null") for k in kind)):
        return True
    values = schema.get("enum")
    return isinstance(values, list) and bool(values) and all(isinstance(v, str) for v in values)


def typed_value(raw: str, schema: Any) -> Any:
    """A parameter's raw text as the value its schema types: a string stays text; anything else is read
    as JSON (Python's ``True``/``False``/``None``, which some templates write, as JSON's). Without a
    schema: JSON when it reads as a JSON object, array, number, boolean or null, else the text."""
    if is_string(schema):
        return raw
    return _loaded(raw)


_PYTHON_WORDS = {"True": True, "False": False, "None": None}


def _loaded(raw: str) -> Any:
    """A non-string value as JSON; as a Python literal where a template wrote one (``{'a': 1}``, ``True``)."""
    stripped = raw.strip()
    if stripped in _PYTHON_WORDS:
        return _PYTHON_WORDS[stripped]
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    if stripped[:1] in ("{", "[", "'", '"'):
        import ast
        import warnings

        try:
            with warnings.catch_warnings():  # (a string's backslashes are its own, not Python's escapes)
                warnings.simplefilter("ignore", SyntaxWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                return _plain(ast.literal_eval(stripped))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
    return raw


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


_CDATA = re.compile(r"(?s)\A<!\[CDATA\[(.*)\]\]>\Z")


def _value_end(literal: str, text: str, position: int) -> int | None:
    """Where a raw value ends: at the first place the literal after it starts (its own leading blanks,
    each optional, belong to the literal). Found by searching for the literal's text, not by trying a
    pattern at every character: an argument may be a whole file."""
    core = literal.strip() or literal
    lead = literal[: len(literal) - len(literal.lstrip())]
    regex = re.compile(literal_regex(literal, after_value=True))
    search = position
    while (found := text.find(core, search)) >= 0:
        start = found
        for blank in reversed(lead):  # the literal's blanks, where the text has them just before
            if start > position and text[start - 1] == blank:
                start -= 1
        if regex.match(text, start):
            return start
        search = found + 1
    return None


def _literal(literal: str, regex: str, text: str, position: int, last: bool) -> int | None:
    """Where ``literal`` (read as ``regex``) ends at ``position``; a text that ends inside it is
    :class:`Incomplete` (at the pattern's end, where a stop token was removed, it is a match)."""
    match = re.compile(regex).match(text, position)
    if match is not None:
        return match.end()
    rest = text[position:].lstrip()
    wanted = BLANKS.sub("", literal)
    if BLANKS.sub("", rest) == wanted[: len(BLANKS.sub("", rest))]:
        if last:
            return len(text)  # (the caller decides whether an unfinished ending is enough)
        raise Incomplete
    return None


def _could_start(pattern: tuple[Segment, ...], text: str, position: int) -> bool:
    """Whether the rest of ``text`` could still grow into ``pattern`` (its first literal begun). Only
    the rest's start is read (the rest may be long: the text after a whole argument)."""
    first = BLANKS.sub("", pattern[0].text) if pattern and pattern[0].kind == "lit" else ""
    window = text[position : position + 4 * len(first) + 64]
    rest = BLANKS.sub("", window)
    if len(window) < len(text) - position and len(rest) >= len(first):
        return rest.startswith(first)
    return first.startswith(rest) or rest.startswith(first)


def _json_arguments(text: str, position: int, progress: Progress) -> int | None:
    while position < len(text) and text[position].isspace():
        position += 1
    if position >= len(text):
        raise Incomplete
    if text[position] != "{":
        return None
    try:
        value, end = json.JSONDecoder().raw_decode(text, position)
    except ValueError:
        progress.arguments = text[position:]
        raise Incomplete from None  # (or not JSON at all: the whole answer tells, when it ends)
    if not isinstance(value, dict):
        return None
    progress.arguments = text[position:end]
    return int(end)


def _scanned(kind: str, text: str, position: int, progress: Progress) -> int | None:
    from llmrun.structured.dialects.values import gemma_object, python_keywords

    reader = python_keywords if kind == "python" else gemma_object
    try:
        result = reader(text, position)
    except ValueError:
        return None
    if result is None:
        raise Incomplete
    value, end = result
    progress.arguments = json.dumps(value, ensure_ascii=False)
    return end
