"""Speculative decoding, the backend-independent half: what to draft, and when drafting pays.

Decoding reads every weight once per token. Speculative decoding proposes K tokens
cheaply (a *draft*), and the target model checks them all in one forward pass: it
samples its own token at each drafted position, keeps the drafts up to the first
position where its token differs, and that token replaces the draft. Every kept
token is one the target itself sampled, so greedy output is the plain decoder's,
token for token; and since every draft here is deterministic (a point mass q), the
standard speculative-sampling rule — accept x with probability min(1, p(x)/q(x)) =
p(x), else draw from norm(max(0, p - q)) = p without x — is exactly "draw from p and
compare", so sampled output has the target's distribution too.

Drafters:

- prompt lookup (``ngram``): the last few tokens are looked up in the prompt and the
  text so far, and the tokens that followed their latest earlier occurrence are the
  draft (llama.cpp's ``--spec-type ngram``, transformers' ``prompt_lookup_num_tokens``);
  nothing to load, and large wins where an answer quotes its input;
- a draft model (``MODEL``): a small model with the same vocabulary drafts greedily
  (see the backends);
- ``auto``: prompt lookup, switched off while the drafts it makes are mostly refused
  (:class:`Gate`, measured as the run goes) and tried again later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from llmrun.errors import InvalidParameter

DraftMode = Literal["off", "ngram", "auto", "model"]
DEFAULT_DRAFT_TOKENS = 8
MAX_DRAFT_TOKENS = 64
NGRAM_SIZES = (3, 2)  # the longest suffix that matches wins; a single token matches too often to pay


@dataclass(frozen=True, slots=True)
class Draft:
    """How a model drafts: ``mode`` (``model``: ``model`` names the draft model) and at most ``tokens`` a step."""

    mode: DraftMode = "off"
    model: str | None = None
    tokens: int = DEFAULT_DRAFT_TOKENS

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int):
            raise InvalidParameter("draft_tokens", self.tokens, f"an integer from 1 to {MAX_DRAFT_TOKENS}")
        if not 1 <= self.tokens <= MAX_DRAFT_TOKENS:
            raise InvalidParameter("draft_tokens", self.tokens, f"an integer from 1 to {MAX_DRAFT_TOKENS}")
        if (self.mode == "model") != bool(self.model):
            raise InvalidParameter("draft", self.model, "a draft model's name with mode 'model', and only then")

    @classmethod
    def parse(cls, value: str | None, tokens: int | None = None) -> Draft:
        """``off``, ``ngram``, ``auto`` or a model (a name or a file); None or empty is off."""
        count = DEFAULT_DRAFT_TOKENS if tokens is None else tokens
        text = (value or "off").strip()
        if not text:
            return cls("off", None, count)
        if text.lower() in ("off", "ngram", "auto"):
            mode: DraftMode = text.lower()  # type: ignore[assignment]
            return cls(mode, None, count)
        return cls("model", text, count)

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @property
    def value(self) -> str:
        """As ``--draft`` spells it: off, ngram, auto, or the draft model."""
        return self.model if self.mode == "model" and self.model else self.mode


class Drafter(Protocol):
    """Proposes the tokens most likely to follow ``history`` (the prompt and the answer so far)."""

    def propose(self, history: Sequence[int], limit: int) -> list[int]: ...

    def close(self) -> None: ...


class PromptLookup:
    """Drafts by copying: the tokens that followed the latest earlier occurrence of the longest
    suffix of ``history`` (``NGRAM_SIZES`` tokens) that occurred before.

    One instance follows one growing sequence: it indexes each n-gram once, as the history grows,
    so a proposal costs the same at any length. A history that is not an extension of the one it
    indexed (a new request) starts a fresh index."""

    def __init__(self, sizes: Sequence[int] = NGRAM_SIZES) -> None:
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        if not self.sizes or self.sizes[-1] < 1:
            raise InvalidParameter("ngram sizes", sizes, "positive integers")
        self._seen: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> the position just after its latest occurrence

    def propose(self, history: Sequence[int], limit: int) -> list[int]:
        if limit < 1 or len(history) < 2:
            return []
        self._follow(history)
        for n in self.sizes:
            if len(history) <= n:
                continue
            start = self._index.get(tuple(history[-n:]))
            if start is not None:
                return list(history[start : start + limit])
        return []

    def _follow(self, history: Sequence[int]) -> None:
        """Index every n-gram that ends before the last position (the suffix itself is the query)."""
        seen = self._seen
        if len(seen) > len(history) or list(history[: len(seen)]) != seen:
            self._seen, self._index = [], {}
            seen = self._seen
        old = len(seen)
        seen.extend(history[old:])
        for end in range(max(old, 1), len(seen)):  # n-grams ending at position end (exclusive)
            for n in self.sizes:
                if end >= n:
                    self._index[tuple(seen[end - n : end])] = end

    def close(self) -> None:
        self._seen, self._index = [], {}


@dataclass
class Gate:
    """``auto``: drafting stays on while enough of what is drafted is kept.

    The kept share is an exponentially weighted mean over verification steps; when it falls under
    ``threshold`` drafting pauses for ``pause`` steps (doubling each time it is found wanting,
    up to ``max_pause``) and then tries again. Verifying K drafted tokens costs one forward pass
    over K+1 positions, about 1 + 0.14·K single-token steps on a small model on two CPU cores
    (more on a GPU's memory-bound decode, where the extra positions are nearly free), so
    drafting pays once more than about a quarter of the drafts are kept."""

    threshold: float = 0.25
    weight: float = 0.3
    pause: int = 8
    max_pause: int = 256
    rate: float = 1.0
    _paused_for: int = 0
    _next_pause: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._next_pause = self.pause

    def length(self, most: int) -> int:
        """How many tokens to draft: about the run the kept share promises (a share p keeps p/(1-p) tokens
        in a row on average), one more to reach past it, at most ``most``."""
        if self.rate >= 0.9:
            return most
        return max(1, min(most, math.ceil(self.rate / (1 - self.rate)) + 1))

    def open(self) -> bool:
        """Whether to draft this step (counts down a pause)."""
        if self._paused_for > 0:
            self._paused_for -= 1
            return False
        return True

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.rate = (1 - self.weight) * self.rate + self.weight * (accepted / drafted)
        if self.rate < self.threshold:
            self._paused_for = self._next_pause
            self._next_pause = min(self._next_pause * 2, self.max_pause)
            self.rate = self.threshold  # a fresh start after the pause: one good step keeps it on
        elif self.rate >= 2 * self.threshold:
            self._next_pause = self.pause


@dataclass
class Tally:
    """What one generation drafted and kept (for ``--stats``, ``--json`` and ``bench``)."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # verification passes that carried a draft

    def record(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.drafted += drafted
            self.accepted += accepted
            self.steps += 1


def acceptance(drafted: int, accepted: int) -> float | None:
    return accepted / drafted if drafted else None


def verify(drafted: Sequence[int], sampled: Sequence[int]) -> int:
    """How many drafted tokens the target's own samples confirm: the length of the common prefix
    (``sampled`` has one token per checked position; the first that differs replaces the draft)."""
    kept = 0
    for draft, token in zip(drafted, sampled, strict=False):
        if draft != token:
            break
        kept += 1
    return kept
