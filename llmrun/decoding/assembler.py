"""The backend-independent half of the generation loop.

A backend supplies the sampled token ids (its forward pass, KV cache and
sampler); an :class:`Assembler` turns them into printable :class:`Token` events
and a final :class:`Done`: it decodes UTF-8 safely across tokens, cuts at stop
strings, stops at end-of-generation tokens, ``max_tokens`` and the context limit,
and times prefill and decode. Every backend, and batch generation, shares it, so
they stop and count alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from llmrun.decoding.events import Candidate, Done, FinishReason, GenerationStats, Token
from llmrun.decoding.sampling import SamplingParams, log_softmax, top_indices
from llmrun.decoding.speculative import Tally
from llmrun.decoding.textstream import StopMatcher, Utf8Stream
from llmrun.errors import ContextFull, LlmrunError
from llmrun.structured.formats import conforms

if TYPE_CHECKING:
    import numpy.typing as npt

    from llmrun.structured.grammar import Constraint

Scorer = Callable[[int], tuple[float, tuple[Candidate, ...]]]


def score(
    logits: npt.NDArray[Any], token_id: int, n: int, piece: Callable[[int], bytes]
) -> tuple[float, tuple[Candidate, ...]]:
    """The sampled token's log-probability under ``logits`` and the ``n`` most likely tokens."""
    logprobs = log_softmax(logits)
    top = tuple(Candidate(i, piece(i), float(logprobs[i])) for i in top_indices(logprobs, n))
    return float(logprobs[token_id]), top


def token_budget(prompt_tokens: int, n_ctx: int, params: SamplingParams) -> tuple[int, FinishReason]:
    """How many tokens may be generated, and the reason generation ends when they are."""
    room = n_ctx - prompt_tokens
    if room < 1:
        raise ContextFull(
            f"the prompt is {prompt_tokens} tokens but the context holds {n_ctx}",
            "shorten the prompt or raise `n_ctx`",
        )
    if params.max_tokens == -1 or params.max_tokens > room:
        return room, "context"
    return params.max_tokens, "length"


class Assembler:
    """Turns one sequence's sampled token ids into text, push by push."""

    def __init__(
        self,
        piece: Callable[[int], bytes],
        is_end: Callable[[int], bool],
        *,
        prompt_tokens: int,
        n_ctx: int,
        params: SamplingParams,
        seed: int | None,
        constraint: Constraint | None = None,
    ) -> None:
        self.limit, self._limit_reason = token_budget(prompt_tokens, n_ctx, params)
        self.constraint = constraint
        if constraint is not None:
            constraint.budget = self.limit  # (a JSON answer is steered to finish within it)
        self._ids: list[int] = []  # the answer's tokens (what a constraint must have seen at the end)
        self._piece = piece
        self._is_end = is_end
        self._utf8 = Utf8Stream()
        self._stops = StopMatcher(params.stop)
        self._parts: list[str] = []
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = 0  # set by a decoder that kept some of the prompt's KV cells
        self.tally = Tally()  # speculative decoding: what a decoder that drafts drafted and kept
        self.seed = seed
        self.generated = 0
        self.finish: FinishReason | None = None
        self.started = time.perf_counter()
        self.first = self.last = self.started

    @classmethod
    def for_request(
        cls,
        piece: Callable[[int], bytes],
        is_end: Callable[[int], bool],
        ids: Sequence[int],
        n_ctx: int,
        params: SamplingParams,
        seed: int | None,
        constraint: Constraint | None = None,
    ) -> Assembler | LlmrunError:
        """The assembler of one batched request, or the error that keeps it from running (its prompt
        does not fit) — a batch decoder reports that request and goes on."""
        try:
            return cls(
                piece, is_end, prompt_tokens=len(ids), n_ctx=n_ctx, params=params, seed=seed, constraint=constraint
            )
        except LlmrunError as exc:
            return exc

    def push(self, token_id: int, score: Scorer | None = None) -> Token | None:
        """Account for one sampled token; the Token to show, or None when it ended generation."""
        self.last = time.perf_counter()
        if self.generated == 0:
            self.first = self.last
        self.generated += 1
        if self._is_end(token_id):
            self.finish = "eos"
            return None
        if self.constraint is not None:
            self._ids.append(token_id)
        text = self._stops.feed(self._utf8.feed(self._piece(token_id)))
        self._parts.append(text)
        if self._stops.stopped_by is not None:
            self.finish = "stop"
        elif self.generated >= self.limit:
            self.finish = self._limit_reason
        if score is None:
            return Token(token_id, text)
        logprob, top = score(token_id)
        return Token(token_id, text, logprob, top)

    def close(self) -> tuple[Token | None, Done]:
        """End of the sequence: the held-back tail (if any) and the final statistics."""
        tail = self._stops.feed(self._utf8.finish()) + self._stops.flush()
        if tail:
            self._parts.append(tail)
        stats = GenerationStats(
            prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated,
            prompt_seconds=self.first - self.started,
            generation_seconds=self.last - self.first,
            finish_reason=self.finish or self._limit_reason,
            seed=self.seed,
            stop_string=self._stops.stopped_by,
            cached_tokens=self.cached_tokens,
            valid=self._valid(),
            drafted=self.tally.drafted,
            accepted=self.tally.accepted,
        )
        return (Token(-1, tail) if tail else None), Done("".join(self._parts), stats)

    def _valid(self) -> bool | None:
        """Constrained output: whether the answer is whole under its format. The model ended it where
        the grammar allowed, or the grammar allows nothing more; an answer cut by ``max_tokens``, the
        context or a stop string is not whole, even when its text so far parses (``123`` of ``12345``)."""
        if self.constraint is None:
            return None
        self.constraint.catch_up(self._ids)
        ended = self.finish == "eos"
        whole = self.constraint.complete if ended else self.finish != "stop" and self.constraint.finished
        # what decoding approximates (oneOf as anyOf) is checked on the finished answer
        fmt = self.constraint.format
        return whole and (fmt.kind != "schema" or conforms(fmt, "".join(self._parts)))


def assemble(
    sampled: Iterator[int],
    piece: Callable[[int], bytes],
    is_end: Callable[[int], bool],
    *,
    prompt_tokens: int,
    n_ctx: int,
    params: SamplingParams,
    seed: int | None,
    score: Scorer | None = None,
    cached_tokens: int = 0,
    constraint: Constraint | None = None,
    tally: Tally | None = None,
    started: float | None = None,
) -> Iterator[Token | Done]:
    """Drive an :class:`Assembler` from a backend's token iterator.

    ``score(token_id)`` (when given) is called as each token arrives, before the
    backend moves on, and returns its log-probability and the top alternatives.
    ``cached_tokens`` of the prompt were already in the backend's cache; ``constraint`` is the
    format the backend constrained the tokens to (its state says whether the answer is whole);
    ``tally`` counts what the backend drafted and kept as it goes (speculative decoding);
    ``started`` is when the backend began on the prompt, when that was before this call.
    """
    assembler = Assembler(
        piece, is_end, prompt_tokens=prompt_tokens, n_ctx=n_ctx, params=params, seed=seed, constraint=constraint
    )
    assembler.cached_tokens = cached_tokens
    if tally is not None:
        assembler.tally = tally
    if started is not None:
        assembler.started = started
    try:
        for token_id in sampled:
            token = assembler.push(token_id, score)
            if token is not None:
                yield token
            if assembler.finish is not None:
                break
    finally:
        close = getattr(sampled, "close", None)
        if close is not None:
            close()
    tail, done = assembler.close()
    if tail is not None:
        yield tail
    yield done
