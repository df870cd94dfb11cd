"""Tokens as people can read them (pure), and the :class:`Vocabulary` every loaded model is.

A character that the tokenizer spelt as several byte tokens (byte fallback) is
shown as one span listing all its ids, so no half character is ever displayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

TokenKind = Literal["control", "user", "normal"]


class Vocabulary(Protocol):
    """A model's tokenizer: text to token ids and back, and what kind each token is (every loaded
    model is one; prompt rendering, token views and draft checks need no more)."""

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]: ...

    def detokenize(self, ids: Sequence[int], *, special: bool = False) -> str: ...

    def token_bytes(self, token_id: int, *, special: bool = False) -> bytes: ...

    def token_kind(self, token_id: int) -> TokenKind:
        """``control`` (plain text never makes it), ``user`` (an added token, matched in any text), else ``normal``."""
        ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    @property
    def adds_bos(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Span:
    ids: tuple[int, ...]
    text: str
    byte_fallback: bool  # several tokens that together spell whole characters


def spans(ids: Sequence[int], piece: Callable[[int], bytes]) -> list[Span]:
    """Group ``ids`` so that every span decodes to whole UTF-8 characters."""
    result: list[Span] = []
    pending_ids: list[int] = []
    pending = b""
    for token_id in ids:
        pending += piece(token_id)
        pending_ids.append(token_id)
        try:
            text = pending.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.reason == "unexpected end of data":
                continue  # a character continues in the next token
            text = pending.decode("utf-8", errors="replace")  # bytes no character can be made of
        result.append(Span(tuple(pending_ids), text, len(pending_ids) > 1))
        pending_ids, pending = [], b""
    if pending_ids:
        result.append(Span(tuple(pending_ids), pending.decode("utf-8", errors="replace"), True))
    return result


def visible(text: str) -> str:
    """Whitespace made visible, for a token table."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") if text.strip() != text or not text else text


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def reusable(kept: Sequence[int], ids: Sequence[int]) -> int:
    """How many of ``ids`` can come from the cells holding ``kept``: their common prefix, less
    one when that is all of ``ids`` (the last prompt token is evaluated for its logits)."""
    return max(0, min(common_prefix(kept, ids), len(ids) - 1))
