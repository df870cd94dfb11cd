"""A dialect: how one model family writes tool calls, read back and (in :mod:`.lark`) constrained.

A :class:`Syntax` holds the family's patterns (:mod:`.pattern`): one call, and optionally what opens and
closes a run of calls and what goes between two. A :class:`Dialect` adds the family's name, the template
text that tells it (:attr:`Dialect.markers`) and how it numbers calls.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llmrun.prompt.template import ToolCall
from llmrun.structured.dialects.pattern import (
    BLANKS,
    Incomplete,
    Progress,
    Reader,
    literal_regex,
    object_text,
    segments,
)
from llmrun.structured.dialects.syntax import Syntax

if TYPE_CHECKING:
    from llmrun.structured.formats import Format
    from llmrun.structured.tools import Marker, Tool, ToolUse

Calls = tuple[str | None, tuple[ToolCall, ...]]


@dataclass(frozen=True)
class Dialect:
    name: str
    syntax: Syntax | None  # None: the generic dialect (no tools in the template)
    markers: tuple[str, ...] = ()  # all of them in a template select this dialect
    family: str = ""  # the models that write this way, for `show`
    native: bool = True
    id_style: Literal["call", "nine"] = "call"
    _readers: dict[str, Reader] = field(default_factory=dict, compare=False, repr=False)

    # --- writing a call's id ------------------------------------------------------------------------

    def new_id(self) -> str:
        if self.id_style == "nine":  # Mistral's templates take exactly nine letters and digits
            return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
        return "call_" + secrets.token_hex(12)

    # --- reading --------------------------------------------------------------------------------

    def parse(self, text: str, tools: Sequence[Tool] = ()) -> Calls:
        """An answer → its text (None when it is only calls) and its calls; ``tools`` type the values
        of dialects that write arguments as text (a ``days`` integer read as 3, a string kept)."""
        if self.syntax is None:
            from llmrun.structured.generic import parse_generic

            return parse_generic(text, self.new_id)
        found = self._read(text, _types(tuple(tools)), partial=False)
        if found is None or not found.calls:
            return text, ()
        calls = tuple(ToolCall(self.new_id(), p.name or "", p.arguments) for p in found.calls)
        rest = (text[: found.start] + text[found.end :]).strip()
        return rest or None, calls

    def progress(self, text: str, tools: Sequence[Tool] = ()) -> list[Progress]:
        """The calls of an answer still being written: each with its name once whole, its arguments
        so far (each text the start of the next: fragments that join to the whole)."""
        assert self.syntax is not None
        found = self._read(text, _types(tuple(tools)), partial=True)
        return found.calls if found is not None else []

    def _reader(self, key: str, pattern: str) -> Reader:
        reader = self._readers.get(key)
        if reader is None:
            assert self.syntax is not None
            params = segments(self.syntax.params) if self.syntax.params else ()
            marks = ("true", "false") if self.syntax.typed == "dsml" else ("string", "")
            reader = self._readers[key] = Reader(segments(pattern), params, marks)
        return reader

    def _read(self, text: str, types: dict[str, dict[str, Any]], *, partial: bool) -> _Found | None:
        syntax = self.syntax
        assert syntax is not None
        begun = self._begin(text)
        if begun is None:
            return None
        start, position = begun
        found = _Found(start, position)
        call = self._reader("call", syntax.call)
        others = [self._reader(f"also{n}", p) for n, p in enumerate(syntax.also)]
        while len(found.calls) < syntax.most:
            progress = Progress()
            try:
                end = _match_any([call, *others], text, position, types, progress)
            except Incomplete:
                if partial and (progress.name or progress.arguments):
                    found.calls.append(progress)
                return found if (partial or found.calls) else None
            if end is None:
                break
            if progress.values or (not progress.arguments and "{params}" in syntax.call):
                progress.arguments = object_text(progress.values, closed=True)
            progress.done = True
            found.calls.append(progress)
            position = found.end = end
            if syntax.between:
                following = re.compile(literal_regex(syntax.between)).match(text, position)
                if following is None:
                    break
                if not _more(call, text, following.end(), types):
                    break
                position = following.end()
            elif not _more(call, text, position, types):
                break
        if not found.calls:
            return None
        if syntax.close:
            closed = re.compile(literal_regex(syntax.close)).match(text, found.end)
            if closed is not None:
                found.end = closed.end()
            elif BLANKS.sub("", syntax.close).startswith(text[found.end :].strip()):
                found.end = len(text)  # a closing stop token the engine removed, or one still coming
        return found

    def _begin(self, text: str) -> tuple[int, int] | None:
        """Where the calls start in ``text`` (the text before is the answer's own) and where the first
        call's pattern begins after the opening."""
        syntax = self.syntax
        assert syntax is not None
        match, first = _earliest(text, self._firsts())
        if match is not None:
            start = match.start()
            blanks = len(first) - len(first.lstrip())  # (a pattern may begin with blanks: gpt-oss's " to=")
            while blanks and start > 0 and text[start - 1].isspace():
                start, blanks = start - 1, blanks - 1
            for other in syntax.opens[1:]:  # an optional opening written just before (Llama's <|python_tag|>)
                before = text[:start].rstrip()
                if other.strip() and before.endswith(other.strip()):
                    start = len(before) - len(other.strip())
            if syntax.lead:
                lead = re.compile(f"(?:{syntax.lead})$").search(text[:start])
                start = lead.start() if lead is not None else start
            if not syntax.opens[0]:
                return start, match.start()
            position = match.end()
            while position < len(text) and text[position].isspace():
                position += 1
            return start, position
        head = len(text) - len(text.lstrip())
        for other in syntax.opens[1:]:  # other spellings, at the answer's start only
            if text.startswith(other, head):
                return head, head + len(other)
        return None

    def _firsts(self) -> list[str]:
        """The texts a run of calls may begin with: the opening, else each call pattern's first text
        (gpt-oss's models write ``<|channel|>commentary to=…`` where its template writes `` to=…``)."""
        syntax = self.syntax
        assert syntax is not None
        if syntax.opens[0]:
            return [syntax.opens[0]]
        heads = (segments(pattern)[0] for pattern in (syntax.call, *syntax.also))
        return [head.text for head in heads if head.kind == "lit" and head.text.strip()]

    # --- constraining -------------------------------------------------------------------------------

    def format(self, use: ToolUse, marker: Marker, answer: Format | None = None) -> Format:
        """What the answer is constrained to: calls in this dialect, or text (or, with ``answer``, a
        JSON document in that format: OpenAI's ``response_format`` beside ``tools``)."""
        from llmrun.errors import UsageError

        if answer is not None and not answer.is_json:
            raise UsageError("with tools, `response_format` must be JSON", "drop the grammar, or the tools")
        if self.syntax is None:
            from llmrun.structured.generic import generic_format

            return generic_format(use, answer)
        from llmrun.structured.dialects.lark import calls_format

        return calls_format(self.syntax, use, marker, answer)

    @property
    def starts(self) -> tuple[str, ...]:
        """Texts an answer that is calls starts with (streaming: text is held while it may become one)."""
        syntax = self.syntax
        assert syntax is not None
        word = (segments(syntax.call)[0].text.strip().split() or [""])[0]
        return (syntax.start, *(o.strip() + word for o in syntax.opens[1:] if o.strip()))


@dataclass(slots=True)
class _Found:
    start: int  # where the calls begin
    end: int  # where they end
    calls: list[Progress] = field(default_factory=list)


def _earliest(text: str, firsts: list[str]) -> tuple[re.Match[str] | None, str]:
    """The first place in ``text`` where one of ``firsts`` is written, and which."""
    best: tuple[re.Match[str] | None, str] = (None, "")
    for first in firsts:
        match = re.compile(literal_regex(first.strip())).search(text)
        if match is not None and (best[0] is None or match.start() < best[0].start()):
            best = (match, first)
    return best


def _match_any(
    readers: list[Reader], text: str, position: int, types: dict[str, dict[str, Any]], progress: Progress
) -> int | None:
    """The first of the call patterns that matches (Incomplete when none does and one may yet)."""
    unfinished: Progress | None = None
    for reader in readers:
        attempt = Progress()
        try:
            end = reader.match(text, position, types, attempt)
        except Incomplete:
            unfinished = unfinished or attempt
            continue
        if end is not None:
            _copy(attempt, progress)
            return end
    if unfinished is not None:
        _copy(unfinished, progress)
        raise Incomplete
    return None


def _copy(source: Progress, target: Progress) -> None:
    target.name, target.arguments, target.values = source.name, source.arguments, source.values


def _more(call: Reader, text: str, position: int, types: dict[str, dict[str, Any]]) -> bool:
    """Whether another call (complete or still being written) starts at ``position``."""
    rest = text[position:].lstrip()
    if not rest:
        return True  # (streaming: the next call may still come; reading whole: nothing to read)
    first = call.pattern[0]
    if first.kind == "lit":
        head = first.text.strip()
        return rest.startswith(head) or (head.startswith(rest) and bool(head))
    try:
        return call.match(text, position, types) is not None
    except Incomplete:
        return True


@functools.lru_cache(maxsize=64)  # a stream asks at every token with the same tools
def _types(tools: tuple[Tool, ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        try:
            schema = json.loads(tool.parameters)
        except ValueError:
            continue
        if isinstance(schema, dict):
            out[tool.name] = schema
    return out
