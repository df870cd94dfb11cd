"""Continuous batching on llama.cpp: many sequences decode together, one ``llama_batch`` a step.

Decoding is bound by memory bandwidth: every step reads all the weights, so
decoding N sequences in one forward pass costs little more than one. Each step
puts the next token of every generating sequence, plus prompt chunks of newly
started ones, into a single batch (each with its own sequence id and positions);
a finished sequence frees its slot and KV cells for the next prompt at once.
Every sequence has its own sampler chain and seed, so its output does not depend
on what else is in the batch.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmrun.backends.base import BatchOutcome, BatchRequest, Done, Token
from llmrun.backends.gguf import sampler_chain
from llmrun.errors import LlmrunError
from llmrun.generation import Assembler
from llmrun.memory import N_BATCH

if TYPE_CHECKING:
    from llmrun.backends.gguf import GgufModel


@dataclass
class _Slot:
    seq: int
    request: BatchRequest
    sampler: Any
    assembler: Assembler
    pending: list[int]  # prompt tokens not yet evaluated
    pos: int = 0
    last: int | None = None  # the sampled token to feed next
    sample_at: int | None = None  # batch index whose logits this slot samples from
    logprobs: int = 0  # alternatives to report with each token


def generate(
    model: GgufModel, requests: Iterable[BatchRequest], parallel: int, n_ctx_seq: int
) -> Generator[BatchOutcome, None, None]:
    """Outcomes as sequences finish (not in request order)."""
    decoder = BatchDecoder(model, parallel, n_ctx_seq)
    queue = deque(requests)
    try:
        while queue or decoder.active:
            while queue and decoder.free:
                request = queue.popleft()
                error = decoder.admit(request)
                if error is not None:
                    yield BatchOutcome(request.index, None, error)
            if not decoder.active:
                continue
            for index, event in decoder.step():
                if isinstance(event, Done):
                    yield BatchOutcome(index, event)
    finally:
        decoder.close()


class BatchDecoder:
    """One llama.cpp context decoding up to ``parallel`` sequences together, one step at a time.

    :meth:`admit` gives a free slot a request, :meth:`step` runs one forward pass over every
    active sequence and returns each one's new :class:`Token` (and :class:`Done` for those that
    finished, freeing their slots), :meth:`cancel` ends one at once. The batch command drives it
    over a known list, the engine's scheduler over requests that keep arriving."""

    def __init__(self, model: GgufModel, parallel: int, n_ctx_seq: int) -> None:
        import llama_cpp
        from llama_cpp import _internals as internals

        params = llama_cpp.llama_context_default_params()
        params.n_ctx = parallel * n_ctx_seq
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = parallel
        params.n_threads = params.n_threads_batch = model.load_params.n_threads
        params.kv_unified = False  # each sequence owns n_ctx_seq cells
        # the same attention kernels and KV types as the single-sequence context, so results agree
        single = model.llama.context_params
        params.flash_attn_type = single.flash_attn_type
        params.type_k, params.type_v = single.type_k, single.type_v
        self.model = model
        self.n_ctx_seq = n_ctx_seq
        self._ctx = internals.LlamaContext(model=model.llama._model, params=params, verbose=False)
        self._batch = internals.LlamaBatch(n_tokens=N_BATCH, embd=0, n_seq_max=1, verbose=False)
        self._slots: list[_Slot | None] = [None] * parallel
        self._n_vocab = int(model.llama.n_vocab())

    @property
    def free(self) -> int:
        return sum(slot is None for slot in self._slots)

    @property
    def active(self) -> bool:
        return any(self._slots)

    def admit(self, request: BatchRequest, logprobs: int = 0) -> LlmrunError | None:
        """Start ``request`` in a free slot; the reason when it cannot run (its prompt does not fit)."""
        seq = self._slots.index(None)
        seed = request.params.run_seed()
        try:
            assembler = Assembler(
                self.model.piece,
                self.model.is_end,
                prompt_tokens=len(request.ids),
                n_ctx=self.n_ctx_seq,
                params=request.params,
                seed=seed,
            )
        except LlmrunError as exc:
            return exc
        self._ctx.kv_cache_seq_rm(seq, -1, -1)
        window = self.n_ctx_seq if request.params.repeat_last_n == -1 else request.params.repeat_last_n
        sampler = sampler_chain(request.params, seed or 0, self._n_vocab, window)
        self._slots[seq] = _Slot(seq, request, sampler, assembler, list(request.ids), logprobs=logprobs)
        return None

    def step(self) -> list[tuple[int, Token | Done]]:
        """One forward pass: each sequence's next token (when it shows text) and the Done of each that ended."""
        events: list[tuple[int, Token | Done]] = []
        _fill(self._batch.batch, self._slots)
        self._ctx.decode(self._batch)
        for seq, slot in enumerate(self._slots):
            if slot is None or slot.sample_at is None:
                continue
            token_id = slot.sampler.sample(self._ctx, slot.sample_at)
            token = slot.assembler.push(token_id, self._scorer(slot) if slot.logprobs else None)
            slot.last = token_id
            if token is not None:
                events.append((slot.request.index, token))
            if slot.assembler.finish is not None:
                events += self._finish(seq)
        return events

    def cancel(self, index: int) -> Done | None:
        """End the sequence of request ``index`` now (its text so far); None when it is not running."""
        for seq, slot in enumerate(self._slots):
            if slot is not None and slot.request.index == index:
                return next(event for _, event in self._finish(seq) if isinstance(event, Done))
        return None

    def close(self) -> None:
        for slot in self._slots:
            if slot is not None:
                _free(self._ctx, slot)
        self._slots = [None] * len(self._slots)
        self._batch.close()
        self._ctx.close()

    def _finish(self, seq: int) -> list[tuple[int, Token | Done]]:
        slot = self._slots[seq]
        assert slot is not None
        tail, done = slot.assembler.close()
        _free(self._ctx, slot)
        self._slots[seq] = None
        index = slot.request.index
        return ([(index, tail)] if tail is not None else []) + [(index, done)]

    def _scorer(self, slot: _Slot) -> Any:
        import numpy as np

        from llmrun.generation import score

        assert slot.sample_at is not None
        row = np.ctypeslib.as_array(self._ctx.get_logits_ith(slot.sample_at), shape=(self._n_vocab,))
        return lambda token_id: score(row, token_id, slot.logprobs, self.model.piece)


def _fill(b: Any, slots: list[_Slot | None]) -> None:
    """One step's batch: a token for each generating sequence, then prompt chunks."""
    n = 0
    for slot in slots:
        if slot is not None and not slot.pending and slot.last is not None:
            _put(b, n, slot.last, slot.pos, slot.seq, True)
            slot.sample_at = n
            slot.pos += 1
            n += 1
        elif slot is not None:
            slot.sample_at = None
    for slot in slots:
        if slot is None or not slot.pending or n >= N_BATCH:
            continue
        chunk = slot.pending[: N_BATCH - n]
        del slot.pending[: len(chunk)]
        for offset, token in enumerate(chunk):
            last = offset == len(chunk) - 1 and not slot.pending
            _put(b, n, token, slot.pos, slot.seq, last)
            if last:
                slot.sample_at = n
            slot.pos += 1
            n += 1
    b.n_tokens = n


def _put(b: Any, index: int, token: int, pos: int, seq: int, logits: bool) -> None:
    b.token[index] = token
    b.pos[index] = pos
    b.n_seq_id[index] = 1
    b.seq_id[index][0] = seq
    b.logits[index] = logits


def _free(ctx: Any, slot: _Slot) -> None:
    ctx.kv_cache_seq_rm(slot.seq, -1, -1)
    with contextlib.suppress(Exception):
        slot.sampler.close()
