"""Where two long strings agree, in about linear time when they differ in few places (pure).

The chat template's attribution (:func:`llmrun.prompt.template.attribute`) aligns two renderings of one
conversation that differ only where the template treated marked special-token strings otherwise. Aligning
them character by character (difflib) is quadratic: 13 s at 40k characters, hours at a 4 MB body. Here:

1. the common beginning and end are cut off (slices compared in C);
2. what is left is cut into lines, then words: the units that occur once in each string and in the same
   order in both (patience diff: a longest increasing subsequence) anchor the alignment, and each stretch
   between two anchors is aligned the same way, on its own;
3. only a stretch with no anchor at all is aligned character by character, and only up to
   :data:`MAX_ALIGNED_CHARS`: beyond that the caller gets :class:`TooFar` instead of minutes of work.
"""

from __future__ import annotations

import bisect
import difflib
import re
from collections.abc import Callable

MAX_ALIGNED_CHARS = 20_000  # the most characters aligned character by character in one place (quadratic)
Block = tuple[int, int, int]  # (start in a, start in b, length)

_WORDS = re.compile(r"\S+\s*|\s+")
_SPLITTERS: tuple[Callable[[str], list[str]], ...] = (
    lambda text: text.splitlines(keepends=True),
    _WORDS.findall,
)


class TooFar(ValueError):
    """The strings disagree over more than :data:`MAX_ALIGNED_CHARS` characters with nothing to anchor on."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size:,} characters disagree in one place")
        self.size = size


def matching_blocks(a: str, b: str) -> list[Block]:
    """Where ``a`` and ``b`` agree, in order, adjacent blocks joined."""
    blocks: list[Block] = []
    _align(a, 0, len(a), b, 0, len(b), blocks, 0)
    return _joined(sorted(blocks))


def _align(a: str, a0: int, a1: int, b: str, b0: int, b1: int, out: list[Block], level: int) -> None:
    head = _agree(a, a0, a1, b, b0, b1, forward=True)
    if head:
        out.append((a0, b0, head))
        a0, b0 = a0 + head, b0 + head
    tail = _agree(a, a0, a1, b, b0, b1, forward=False)
    if tail:
        out.append((a1 - tail, b1 - tail, tail))
        a1, b1 = a1 - tail, b1 - tail
    if a0 == a1 or b0 == b1:
        return
    while level < len(_SPLITTERS):
        units_a, units_b = _SPLITTERS[level](a[a0:a1]), _SPLITTERS[level](b[b0:b1])
        anchors = _anchors(units_a, units_b)
        if anchors:
            _between(a, a0, a1, b, b0, b1, units_a, units_b, anchors, out, level)
            return
        level += 1
    size = (a1 - a0) + (b1 - b0)
    if size > MAX_ALIGNED_CHARS:
        raise TooFar(size)
    matcher = difflib.SequenceMatcher(None, a[a0:a1], b[b0:b1], autojunk=False)
    out.extend((a0 + m.a, b0 + m.b, m.size) for m in matcher.get_matching_blocks() if m.size)


def _between(
    a: str,
    a0: int,
    a1: int,
    b: str,
    b0: int,
    b1: int,
    units_a: list[str],
    units_b: list[str],
    anchors: list[tuple[int, int]],
    out: list[Block],
    level: int,
) -> None:
    """Each anchor unit as a block, and each stretch before, between and after them aligned on its own."""
    starts_a, starts_b = _offsets(units_a, a0), _offsets(units_b, b0)
    at_a, at_b = a0, b0
    for i, j in anchors:
        _align(a, at_a, starts_a[i], b, at_b, starts_b[j], out, level)
        out.append((starts_a[i], starts_b[j], len(units_a[i])))
        at_a, at_b = starts_a[i + 1], starts_b[j + 1]
    _align(a, at_a, a1, b, at_b, b1, out, level)


def _anchors(units_a: list[str], units_b: list[str]) -> list[tuple[int, int]]:
    """(index in a, index in b) of the units that occur once in each, the longest run in the same order."""
    count_a: dict[str, int] = {}
    for unit in units_a:
        count_a[unit] = count_a.get(unit, 0) + 1
    where_b: dict[str, int] = {}
    for j, unit in enumerate(units_b):
        where_b[unit] = -1 if unit in where_b else j
    pairs = [(i, where_b[u]) for i, u in enumerate(units_a) if count_a[u] == 1 and where_b.get(u, -1) >= 0]
    return _increasing(pairs)


def _increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest subsequence of ``pairs`` (in order of their first) whose seconds increase."""
    tails: list[int] = []  # tails[k]: the smallest second ending an increasing run of length k + 1
    ends: list[int] = []  # the index in pairs of that run's last pair
    before: list[int] = []
    for index, (_, second) in enumerate(pairs):
        k = bisect.bisect_left(tails, second)
        if k == len(tails):
            tails.append(second)
            ends.append(index)
        else:
            tails[k] = second
            ends[k] = index
        before.append(ends[k - 1] if k else -1)
    run: list[tuple[int, int]] = []
    index = ends[-1] if ends else -1
    while index >= 0:
        run.append(pairs[index])
        index = before[index]
    return run[::-1]


def _agree(a: str, a0: int, a1: int, b: str, b0: int, b1: int, *, forward: bool) -> int:
    """How many characters a[a0:a1] and b[b0:b1] share at their start (or end): a binary search over
    slices compared in C."""
    low, high = 0, min(a1 - a0, b1 - b0)
    while low < high:
        middle = (low + high + 1) // 2
        same = a[a0 : a0 + middle] == b[b0 : b0 + middle] if forward else a[a1 - middle : a1] == b[b1 - middle : b1]
        if same:
            low = middle
        else:
            high = middle - 1
    return low


def _offsets(units: list[str], start: int) -> list[int]:
    offsets = [start]
    for unit in units:
        offsets.append(offsets[-1] + len(unit))
    return offsets


def _joined(blocks: list[Block]) -> list[Block]:
    joined: list[Block] = []
    for a, b, size in blocks:
        if joined and joined[-1][0] + joined[-1][2] == a and joined[-1][1] + joined[-1][2] == b:
            last = joined.pop()
            joined.append((last[0], last[1], last[2] + size))
        else:
            joined.append((a, b, size))
    return joined
