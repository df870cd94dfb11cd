"""The backend-independent half of the generation loop.

A backend supplies the sampled token ids (its forward pass, KV cache and
sampler); :func:`assemble` turns them into printable :class:`Token` events and a
final :class:`Done`: it decodes UTF-8 safely across tokens, cuts at stop strings,
stops at end-of-generation tokens, ``max_tokens`` and the context limit, and
times prefill and decode. Every backend shares it, so they stop and count alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from llmrun.backends.base import Candidate, Done, FinishReason, GenerationStats, Token
from llmrun.errors import UsageError
from llmrun.sampling import SamplingParams
from llmrun.textstream import StopMatcher, Utf8Stream


def token_budget(prompt_tokens: int, n_ctx: int, params: SamplingParams) -> tuple[int, FinishReason]:
    """How many tokens may be generated, and the reason generation ends when they are."""
    room = n_ctx - prompt_tokens
    if room < 1:
        raise UsageError(
            f"the prompt is {prompt_tokens} tokens but the context holds {n_ctx}",
            "shorten the prompt or raise --ctx",
        )
    if params.max_tokens == -1 or params.max_tokens > room:
        return room, "context"
    return params.max_tokens, "length"


def assemble(
    sampled: Iterator[int],
    piece: Callable[[int], bytes],
    is_end: Callable[[int], bool],
    *,
    prompt_tokens: int,
    n_ctx: int,
    params: SamplingParams,
    seed: int | None,
    score: Callable[[int], tuple[float, tuple[Candidate, ...]]] | None = None,
) -> Iterator[Token | Done]:
    """``score(token_id)`` (when given) is called as each token arrives, before the
    backend moves on, and returns its log-probability and the top alternatives."""
    limit, limit_reason = token_budget(prompt_tokens, n_ctx, params)
    utf8 = Utf8Stream()
    stops = StopMatcher(params.stop)
    parts: list[str] = []
    finish: FinishReason = limit_reason
    generated = 0
    start = time.perf_counter()
    first = last = start
    try:
        for token_id in sampled:
            last = time.perf_counter()
            if generated == 0:
                first = last
            generated += 1
            if is_end(token_id):
                finish = "eos"
                break
            text = stops.feed(utf8.feed(piece(token_id)))
            parts.append(text)
            if score is None:
                yield Token(token_id, text)
            else:
                logprob, top = score(token_id)
                yield Token(token_id, text, logprob, top)
            if stops.stopped_by is not None:
                finish = "stop"
                break
            if generated >= limit:
                break
    finally:
        close = getattr(sampled, "close", None)
        if close is not None:
            close()
    tail = stops.feed(utf8.finish()) + stops.flush()
    if tail:
        parts.append(tail)
        yield Token(-1, tail)
    stats = GenerationStats(
        prompt_tokens=prompt_tokens,
        generated_tokens=generated,
        prompt_seconds=first - start,
        generation_seconds=last - first,
        finish_reason=finish,
        seed=seed,
        stop_string=stops.stopped_by,
    )
    yield Done("".join(parts), stats)
