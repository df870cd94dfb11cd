"""Speculative decoding on llama.cpp: the target checks a whole draft in one forward pass.

Each step puts the last sampled token and up to K drafted tokens in one ``llama_batch``
with logits at every position, then samples the target's token at each position in turn
with the request's own sampler chain (llama.cpp's, as the plain path builds it): while the
sampled token equals the draft the next position's logits are the right ones and sampling
goes on; the first that differs is the target's correction and the rest of the draft is
dropped from the KV cache. One sampler draw per emitted token, in the same order as plain
decoding, so a seeded run samples the same tokens (see :mod:`llmrun.decoding.speculative` for why
"sample and compare" is the speculative-sampling rule for a deterministic draft).

The model's ``Llama`` bookkeeping (``n_tokens``, ``input_ids``) is kept as ``Llama.eval``
keeps it, so the next request — the next turn of a chat, speculative or not — reuses the
KV prefix as before. Cells of drafted tokens that were evaluated but not kept describe
``input_ids`` truthfully until they are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from llmrun.backends.llama_parts import LlamaModel
from llmrun.decoding.assembler import assemble, score, token_budget
from llmrun.decoding.events import Done, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.decoding.speculative import Drafter, Gate, PromptLookup, Tally
from llmrun.decoding.tokens import common_prefix

if TYPE_CHECKING:
    from llmrun.structured.grammar import Constraint


def prefill(llama: Any, ids: Sequence[int]) -> int:
    """Bring ``llama``'s KV cache to ``ids`` as ``Llama.generate`` does (keep the longest common prefix,
    less the last token, whose logits are needed); how many prompt tokens were kept."""
    kept = min(common_prefix(llama.input_ids[: llama.n_tokens].tolist(), ids), len(ids) - 1)
    if kept > 0 and llama._ctx.kv_cache_seq_rm(-1, kept, -1):
        llama.n_tokens = kept
    else:
        kept = 0
        llama.reset()
    llama.eval(list(ids[kept:]))
    return kept


def _decode_all(llama: Any, tokens: Sequence[int]) -> None:
    """Append ``tokens`` to the KV cache with logits at every position (batch rows 0..len-1)."""
    start = llama.n_tokens
    llama._ctx.kv_cache_seq_rm(-1, start, -1)
    llama._batch.set_batch(batch=list(tokens), n_past=start, logits_all=True)
    llama._ctx.decode(llama._batch)
    llama.input_ids[start : start + len(tokens)] = tokens
    llama.n_tokens = start + len(tokens)


class _Position:
    """The batch row the latest token was sampled from (-1: the prefill's last), for its log-probability."""

    row = -1


def speculative_stream(
    model: LlamaModel,
    ids: Sequence[int],
    params: SamplingParams,
    drafter: Drafter,
    draft_tokens: int,
    *,
    gate: Gate | None = None,
    logprobs: int = 0,
    constraint: Constraint | None = None,
) -> Iterator[Token | Done]:
    """:meth:`LlamaModel.stream` with drafting: the same events, and the draft counts in the stats."""
    seed = params.run_seed()
    tally = Tally()
    position = _Position()
    budget, _ = token_budget(len(ids), model.n_ctx, params)  # raises ContextFull before any work
    started = time.perf_counter()  # the prefill is the first token's time, as on the plain path
    cached = prefill(model.llama, ids)
    sampled = _sampled(model, ids, params, seed, drafter, draft_tokens, gate, tally, position, budget, constraint)
    yield from assemble(
        sampled,
        model.piece,
        model.is_end,
        prompt_tokens=len(ids),
        n_ctx=model.n_ctx,
        params=params,
        seed=seed,
        score=_scorer(model, position, logprobs) if logprobs > 0 else None,
        cached_tokens=cached,
        constraint=constraint,
        tally=tally,
        started=started,
    )


def _scorer(model: LlamaModel, position: _Position, n: int) -> Callable[[int], Any]:
    import numpy as np

    n_vocab = int(model.llama.n_vocab())

    def scored(token_id: int) -> Any:
        row = np.ctypeslib.as_array(model.llama._ctx.get_logits_ith(position.row), shape=(n_vocab,))
        return score(row, token_id, n, model.piece)

    return scored


def _sampled(
    model: LlamaModel,
    ids: Sequence[int],
    params: SamplingParams,
    seed: int | None,
    drafter: Drafter,
    draft_tokens: int,
    gate: Gate | None,
    tally: Tally,
    position: _Position,
    budget: int,
    constraint: Constraint | None,
) -> Iterator[int]:
    """The target's sampled tokens, checking a draft at every step (the prompt is already evaluated)."""
    from llmrun.backends.llama_parts import sample_row, sampler_chain

    llama = model.llama
    n_vocab = int(llama.n_vocab())
    window = model.n_ctx if params.repeat_last_n == -1 else params.repeat_last_n
    chain = sampler_chain(params, seed or 0, n_vocab, window)

    def sample(row: int) -> int:
        position.row = row
        return sample_row(llama._ctx, chain, row, n_vocab, constraint)

    try:
        token = sample(-1)
        history = [*ids, token]
        produced = 1
        yield token
        while True:
            room = min(draft_tokens, model.n_ctx - llama.n_tokens - 2, budget - produced - 1)
            if gate is not None:
                room = gate.length(room)
            drafts = drafter.propose(history, room)[:room] if room > 0 else []
            start = llama.n_tokens
            began = time.perf_counter()
            _decode_all(llama, [token, *drafts])
            seconds = time.perf_counter() - began
            kept = 0
            for row in range(len(drafts) + 1):
                token = sample(row)
                history.append(token)
                produced += 1
                yield token
                if row == len(drafts) or token != drafts[row]:
                    break
                kept += 1
            tally.record(len(drafts), kept)
            if gate is not None:
                gate.record(len(drafts), kept, seconds)
            valid = start + 1 + kept  # the cells of the tokens the target kept
            if valid < llama.n_tokens:
                llama._ctx.kv_cache_seq_rm(-1, valid, -1)
                llama.n_tokens = valid
    finally:
        chain.close()


class ModelDrafter:
    """A small GGUF model with the target's vocabulary drafts greedily, one token a forward pass,
    on a KV cache of its own that follows the text as the target keeps it (prefix reuse)."""

    def __init__(self, draft: LlamaModel) -> None:
        self.draft = draft

    def propose(self, history: Sequence[int], limit: int) -> list[int]:
        import numpy as np

        llama = self.draft.llama
        if limit < 1 or len(history) + limit > self.draft.n_ctx:
            return []
        prefill(llama, history)
        n_vocab = int(llama.n_vocab())
        out: list[int] = []
        while True:
            logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(-1), shape=(n_vocab,))
            token = int(np.argmax(logits))
            out.append(token)
            if len(out) >= limit or self.draft.is_end(token):
                return out
            llama.eval([token])

    def close(self) -> None:
        self.draft.close()


def drafter_for(model: LlamaModel, prompt_tokens: int) -> Drafter:
    """The drafter a stream uses: the draft model when one is loaded, else prompt lookup (fresh per request)."""
    return model.draft_model_drafter or PromptLookup(prompt_tokens=prompt_tokens)
