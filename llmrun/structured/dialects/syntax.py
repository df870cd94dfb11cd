"""A family's tool-call syntax: the patterns (:mod:`.pattern`) of one call, and of what opens, separates
and closes a run of them (pure data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmrun.structured.dialects.pattern import segments

Typed = Literal["dsml", "json_type"]


@dataclass(frozen=True, slots=True)
class Syntax:
    """``call``: one call's pattern; ``params``: one parameter's (for ``{params}``); ``opens``: what
    opens a run of calls, as written first, then other spellings read only at the answer's start (a
    control token that shows as nothing, an optional tag); ``between``/``close``: between two calls and
    after the last; ``typed``: what a ``{typed}`` attribute holds (DeepSeek's string="true|false", or the
    JSON type's name); ``id``: the regular expression an ``{id}`` is written in; ``also``: other call
    patterns read (not written); ``lead``: a regular expression for text the family writes just before
    its calls, dropped from the answer's text; ``loose``: the family's templates differ in blanks between
    tags, and the grammar allows each of them or none."""

    call: str
    params: str = ""
    opens: tuple[str, ...] = ("",)
    between: str = ""
    close: str = ""
    typed: Typed = "dsml"
    id: str = "[A-Za-z0-9]{9}"
    most: int = 8  # calls in one answer
    also: tuple[str, ...] = ()
    lead: str = ""
    loose: bool = False
    first_index: int = 0  # what an {index} slot numbers the first call
    json_call: str = ""  # the call is a bare JSON object with this arguments key: written as one JSON document

    @property
    def start(self) -> str:
        """The text a run of calls starts with, as written, up to its first blank."""
        head = (self.opens[0] or segments(self.call)[0].text).strip()
        return head.split()[0] if head else ""
