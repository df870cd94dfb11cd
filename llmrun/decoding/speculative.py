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
  text so far, and the tokens that followed their first occurrence are the draft (as
  transformers' ``prompt_lookup_num_tokens`` and llama-cpp-python's
  ``LlamaPromptLookupDecoding`` choose); nothing to load, and large wins where an answer
  quotes its input;
- a draft model (``MODEL``): a small model with the same vocabulary drafts greedily
  (see the backends);
- ``auto``: prompt lookup, switched off while the drafts it makes are mostly refused
  (:class:`Gate`, measured as the run goes) and tried again later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from llmrun.errors import InvalidParameter, UsageError

if TYPE_CHECKING:
    from llmrun.decoding.tokens import Vocabulary

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
    """Drafts by copying: the tokens that followed an earlier occurrence of the longest suffix of
    ``history`` (``NGRAM_SIZES`` tokens) that occurred before — its latest occurrence in the answer
    so far, else its first in the prompt.

    In the prompt the first occurrence, as transformers' and llama-cpp-python's prompt lookup
    choose: what an answer quotes is its input, which comes first, while the latest occurrence is
    often the question restated at the end (a RAG prompt's "How are the backup keys rotated?"
    against the passage the answer copies). In the answer the latest: an answer that repeats
    itself (a list's recurring shape, a model in a loop) goes on as it last went. Both measured in
    ``benchmarks/bench_spec.py``.

    One instance follows one growing sequence: its first ``prompt_tokens`` tokens are the prompt
    (None: the history of the first proposal less its last token, the first sampled), and the rest
    is the answer. It indexes each n-gram once, as the history grows, so a proposal costs the same
    at any length. A history that is not an extension of the one it indexed (a new request) starts
    a fresh index."""

    def __init__(self, sizes: Sequence[int] = NGRAM_SIZES, prompt_tokens: int | None = None) -> None:
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        if not self.sizes or self.sizes[-1] < 1:
            raise InvalidParameter("ngram sizes", sizes, "positive integers")
        self.prompt_tokens = prompt_tokens
        self._seen: list[int] = []
        self._answer = 0  # where the answer begins in the history
        self._first: dict[tuple[int, ...], int] = {}  # n-gram -> the position just after its first occurrence
        self._latest: dict[tuple[int, ...], int] = {}  # … after its latest occurrence within the answer

    def propose(self, history: Sequence[int], limit: int) -> list[int]:
        if limit < 1 or len(history) < 2:
            return []
        self._follow(history)
        for n in self.sizes:
            if len(history) <= n:
                continue
            suffix = tuple(history[-n:])
            start = self._latest.get(suffix, self._first.get(suffix))
            if start is not None:
                return list(history[start : start + limit])
        return []

    def _follow(self, history: Sequence[int]) -> None:
        """Index every n-gram that ends before the last position (the suffix itself is the query)."""
        seen = self._seen
        if not seen or len(seen) > len(history) or list(history[: len(seen)]) != seen:
            self.close()
            self._answer = len(history) - 1 if self.prompt_tokens is None else self.prompt_tokens
            seen = self._seen
        old = len(seen)
        seen.extend(history[old:])
        for end in range(max(old, 1), len(seen)):  # n-grams ending at position end (exclusive)
            for n in self.sizes:
                if end >= n:
                    gram = tuple(seen[end - n : end])
                    self._first.setdefault(gram, end)
                    if end - n >= self._answer:
                        self._latest[gram] = end

    def close(self) -> None:
        self._seen, self._first, self._latest = [], {}, {}


@dataclass
class Gate:
    """``auto``: each step drafts the number of tokens that pays best, by what this run has measured.

    Checking k drafted tokens costs one forward pass over k+1 positions: ``a + b·k`` seconds, a line
    fitted to the passes timed so far (exponentially weighted, so it follows the context as it grows;
    ``b/a`` is about 0.14 for the packaged Gemma and 0.37 for SmolLM2-135M on two CPU cores, and near
    0 on a GPU's memory-bound decode). A draft is kept token by token with probability ``p`` until the
    first refusal, so k tokens yield ``1 + p + … + p^k`` tokens on average. ``p`` is estimated as
    tokens kept / (tokens kept + refusals), both counted over the steps so far (exponentially
    weighted): the maximum-likelihood estimate for that model, in which a draft of 8 kept whole
    weighs eight times one token kept. (Averaging each step's kept fraction instead weighs a quote's
    long drafts like single tokens: bench_spec's RAG answer went 1.40x instead of 1.60x.) The step
    drafts the k (0 … ``most``) with the most tokens a second; when that is 0 it drafts nothing,
    and every ``probe`` steps it drafts one token anyway, to notice when drafts start to pay again
    (a quote begins)."""

    # Drafted tokens kept and refusals, weighted. The defaults are a first guess, p = 0.75 worth four
    # tokens, which what the run shows replaces within a few steps.
    kept: float = 3.0
    refused: float = 1.0
    prior_ratio: float = 0.25  # b/a until the passes measured say otherwise
    decay: float = 0.9
    probe: int = 16
    _idle: int = field(default=0, init=False)
    _fit: list[float] = field(default_factory=lambda: [0.0] * 5, init=False)  # weights of 1, k, t, k², k·t

    def length(self, most: int) -> int:
        """How many tokens to draft this step (0: none)."""
        ratio = self.ratio()
        best_k, best, expected, term = 0, 1.0, 1.0, 1.0
        for k in range(1, most + 1):
            term *= self.p
            expected += term
            value = expected / (1 + ratio * k)
            if value > best:
                best_k, best = k, value
        if best_k == 0 and most > 0:
            self._idle += 1
            if self._idle >= self.probe:
                self._idle = 0
                return 1
        return best_k

    def ratio(self) -> float:
        """The cost of a drafted position relative to a pass without draft (``b/a``), as measured."""
        n, sk, st, skk, skt = self._fit
        if n < 3:
            return self.prior_ratio
        var = skk / n - (sk / n) ** 2
        if var < 0.2:  # the widths timed are too alike to fit a slope
            return self.prior_ratio
        slope = (skt / n - (sk / n) * (st / n)) / var
        intercept = st / n - slope * sk / n
        if intercept <= 0:
            return self.prior_ratio
        return max(0.0, slope / intercept)

    def record(self, drafted: int, accepted: int, seconds: float | None = None) -> None:
        """One pass: ``drafted`` tokens checked, ``accepted`` kept, taking ``seconds`` (None: not timed)."""
        if seconds is not None:
            self._fit = [self.decay * w for w in self._fit]
            k = float(drafted)
            for i, value in enumerate((1.0, k, seconds, k * k, k * seconds)):
                self._fit[i] += value
        if drafted <= 0:
            return
        self.kept = self.decay * self.kept + accepted
        self.refused = self.decay * self.refused + (1 if accepted < drafted else 0)

    @property
    def p(self) -> float:
        """The chance that the next drafted token is kept, given the ones before it were."""
        return self.kept / (self.kept + self.refused)


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


def check_vocabulary(target: Vocabulary, draft: Vocabulary, draft_name: str, sizes: tuple[int, int]) -> None:
    """A draft must spell tokens as the model does (llama.cpp's check: vocabulary sizes within 128 of
    each other, the same start and end tokens, the same bytes for the tokens both have — here the first
    512 and an even sample of the rest); one line when it does not. ``sizes``: the model's, the draft's."""
    n_target, n_draft = sizes
    hint = "use a draft model of the same family (a smaller quant of the same model, or a smaller sibling)"
    if abs(n_target - n_draft) > 128:
        raise UsageError(f"draft model {draft_name} has a vocabulary of {n_draft} tokens, the model {n_target}", hint)
    if (target.bos_id, target.eos_id) != (draft.bos_id, draft.eos_id):
        raise UsageError(f"draft model {draft_name} has different start and end tokens from the model", hint)
    shared = min(n_target, n_draft)
    step = max(1, shared // 4096)
    for token_id in [*range(min(shared, 512)), *range(512, shared, step)]:
        if target.token_bytes(token_id, special=True) != draft.token_bytes(token_id, special=True):
            raise UsageError(
                f"draft model {draft_name} spells token {token_id} differently from the model: "
                "their vocabularies differ",
                hint,
            )
