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

from llmrun.backends.base import BatchOutcome, BatchRequest
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


def generate(
    model: GgufModel, requests: Iterable[BatchRequest], parallel: int, n_ctx_seq: int
) -> Generator[BatchOutcome, None, None]:
    """Outcomes as sequences finish (not in request order)."""
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
    ctx = internals.LlamaContext(model=model.llama._model, params=params, verbose=False)
    batch = internals.LlamaBatch(n_tokens=N_BATCH, embd=0, n_seq_max=1, verbose=False)
    queue = deque(requests)
    slots: list[_Slot | None] = [None] * parallel
    n_vocab = int(model.llama.n_vocab())
    try:
        while queue or any(slots):
            yield from _start(model, ctx, queue, slots, n_ctx_seq, n_vocab)
            if not any(slots):
                continue
            _fill(batch.batch, slots)
            ctx.decode(batch)
            for index, slot in enumerate(slots):
                if slot is None or slot.sample_at is None:
                    continue
                token = slot.sampler.sample(ctx, slot.sample_at)
                slot.assembler.push(token)
                slot.last = token
                if slot.assembler.finish is not None:
                    _, done = slot.assembler.close()
                    _free(ctx, slot)
                    slots[index] = None
                    yield BatchOutcome(slot.request.index, done)
    finally:
        for slot in slots:
            if slot is not None:
                _free(ctx, slot)
        batch.close()
        ctx.close()


def _start(
    model: GgufModel,
    ctx: Any,
    queue: deque[BatchRequest],
    slots: list[_Slot | None],
    n_ctx_seq: int,
    n_vocab: int,
) -> Generator[BatchOutcome, None, None]:
    """Give free slots the next requests; report the ones that cannot run."""
    for seq, slot in enumerate(slots):
        while slot is None and queue:
            request = queue.popleft()
            seed = request.params.run_seed()
            try:
                assembler = Assembler(
                    model.piece,
                    model.is_end,
                    prompt_tokens=len(request.ids),
                    n_ctx=n_ctx_seq,
                    params=request.params,
                    seed=seed,
                )
            except LlmrunError as exc:
                yield BatchOutcome(request.index, None, exc.message)
                continue
            ctx.kv_cache_seq_rm(seq, -1, -1)
            window = n_ctx_seq if request.params.repeat_last_n == -1 else request.params.repeat_last_n
            sampler = sampler_chain(request.params, seed or 0, n_vocab, window)
            slot = _Slot(seq, request, sampler, assembler, list(request.ids))
            slots[seq] = slot


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
