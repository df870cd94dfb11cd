"""Reading attention maps: pure functions on (heads, queries, keys) weights."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    F32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Attended:
    position: int
    weight: float


def head_map(weights: F32, head: int | None) -> F32:
    """One head's (queries, keys) map, or the heads' mean (``head`` None)."""
    import numpy as np

    result: F32 = weights.mean(axis=0).astype(np.float32) if head is None else weights[head]
    return result


def strongest(row: F32, k: int, upto: int | None = None) -> list[Attended]:
    """The ``k`` keys a query row weighs most (among keys ``< upto``), strongest first; keys it gives no
    weight at all are left out (one is always named)."""
    import numpy as np

    values = row[: upto if upto is not None else row.shape[0]]
    order = np.argsort(-values, kind="stable")[:k]
    found = [Attended(int(i), float(values[i])) for i in order]
    return [a for a in found if a.weight > 0] or found[:1]


def follow(attention: Mapping[int, F32], query: int, k: int, head: int | None = None) -> dict[int, list[Attended]]:
    """Per layer, the keys one query weighs most (its heads averaged, or one head)."""
    return {
        layer: strongest(head_map(weights, head)[query], k, query + 1) for layer, weights in sorted(attention.items())
    }


def overview(attention: Mapping[int, F32], query: int) -> dict[int, list[Attended]]:
    """Per layer, per head, the key one query weighs most: the grid to pick interesting heads from."""
    return {
        layer: [strongest(weights[head, query], 1, query + 1)[0] for head in range(weights.shape[0])]
        for layer, weights in sorted(attention.items())
    }


def without_first(attention: Mapping[int, F32]) -> dict[int, F32]:
    """The maps with the first key left out and each row rescaled to sum to 1 (the first query, which
    has only that key, keeps it): most heads park their weight on the first token when nothing else
    matters (an attention sink), which hides what they do read."""
    import numpy as np

    result: dict[int, F32] = {}
    for layer, weights in attention.items():
        rest = weights.copy()
        rest[:, 1:, 0] = 0
        total = rest.sum(axis=-1, keepdims=True)
        result[layer] = np.divide(rest, total, out=np.zeros_like(rest), where=total > 0).astype(np.float32)
    return result


def find_token(pieces: Sequence[str], wanted: str) -> int:
    """The position of a token given as its text (the first match, ignoring surrounding spaces and case;
    ``it#2`` is the second ``it``) or as ``#N``, a position. ValueError says what is there instead."""
    text, _, nth = wanted.partition("#")
    if not text and nth.isdigit():
        position = int(nth)
        if position >= len(pieces):
            raise ValueError(f"position {position} is past the prompt's last token ({len(pieces) - 1})")
        return position
    needle = text.strip().casefold()
    matches = [i for i, piece in enumerate(pieces) if piece.strip().casefold() == needle and needle]
    which = int(nth) if nth.isdigit() else 1
    if len(matches) < which or which < 1:
        shown = ", ".join(repr(p) for p in pieces[:40])
        raise ValueError(f"{wanted!r} is not a token of the prompt; its tokens are {shown}")
    return matches[which - 1]
