"""Tokens as people can read them (pure).

A character that the tokenizer spelt as several byte tokens (byte fallback) is
shown as one span listing all its ids, so no half character is ever displayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


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
