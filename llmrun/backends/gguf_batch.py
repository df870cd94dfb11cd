"""Continuous batching on llama.cpp: many sequences decode together, one ``llama_batch`` a step.

Decoding is bound by memory bandwidth: every step reads all the weights, so
decoding N sequences in one forward pass costs little more than one. Each step
puts the next token of every generating sequence, plus prompt chunks of newly
started ones, into a single batch (each with its own sequence id and positions);
a finished sequence frees its slot for the next prompt at once.
Every sequence has its own sampler chain and seed, so its output does not depend
on what else is in the batch.

With ``reuse_prefix`` (the server's prompt cache) a finished sequence keeps its KV
cells: the next request that starts in that slot evaluates only what follows the
longest prefix it shares with them (the next turn of a conversation, the same system
prompt), and a request goes to the free slot that shares the most. Cells computed in
other batches round differently from a fresh evaluation (log-probabilities move by up
to about 0.3 on the packaged Gemma), so a greedy answer can part from the uncached one
at a near-tie, as it can with batching. With a sliding-window cache the kept cells must
still cover the window before the first new token, else the prompt is evaluated whole.

With the model's KV store (:mod:`llmrun.models.kv_store`) a slot also starts from a prefix kept on
disk when that spares more than its own cells, and cells about to be overwritten (or left when the
decoder closes: the server stopping) are kept there first, so a conversation comes back after a
restart. ``generate`` (the batch command) evaluates the prefix every request shares once — or takes
it from the store — and copies its cells into every sequence before the first request starts.
The same prompt admitted to two slots at once (``n`` choices) is evaluated in one of them: the other
takes its cells and samples its first token from the same logits row (:meth:`BatchDecoder._join_leaders`).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmrun.backends.llama_parts import LlamaModel, sample_row, sampler_chain
from llmrun.decoding.assembler import Assembler
from llmrun.decoding.events import BatchOutcome, BatchRequest, Done, Token
from llmrun.decoding.speculative import Gate, PromptLookup
from llmrun.decoding.tokens import common_prefix, reusable
from llmrun.errors import LlmrunError
from llmrun.formats.memory import N_BATCH
from llmrun.models.kv_store import MIN_REUSE, MIN_SAVE


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
    cached: list[int] = field(default_factory=list)  # the tokens in this sequence's KV cells, from position 0
    lookup: PromptLookup | None = None  # speculative decoding: this sequence's drafter
    gate: Gate | None = None  # auto: how much to draft, by what pays
    drafts: list[int] = field(default_factory=list)  # this step's draft, after ``last``
    shown: list[Token] = field(default_factory=list)  # this step's tokens to report
    keep_at: int = 0  # the KV store wants the cells of the prompt up to here (where it leaves a kept prefix)
    follows: _Slot | None = None  # the same prompt in another slot (n > 1): its cells and first logits are shared


def window_intact(pos_min: int, reused: int, n_swa: int) -> bool:
    """Whether the cells left after keeping positions ``[pos_min, reused)`` hold what the next token
    attends to: all of them, or with a sliding window of ``n_swa``, the window. llama.cpp masks a key
    when ``query - key >= n_swa``, so the token at ``reused`` reads from ``reused - n_swa + 1`` on; a
    state llama.cpp saved holds exactly those (and one more), so a kept conversation, restored and
    cut back to its prompt, still passes (llama-server asks for two more, and evaluates it again)."""
    if reused == 0:
        return True
    return 0 <= pos_min <= (max(0, reused - n_swa + 1) if n_swa > 0 else 0)


def generate(
    model: LlamaModel, requests: Iterable[BatchRequest], parallel: int, n_ctx_seq: int
) -> Generator[BatchOutcome, None, None]:
    """Outcomes as sequences finish (not in request order); the prefix all requests share is evaluated once."""
    queue = deque(requests)
    shared = shared_prefix([request.ids for request in queue])
    decoder = BatchDecoder(model, parallel, n_ctx_seq)
    try:
        decoder.share(shared)
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


def shared_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The tokens every prompt starts with, less each one's last (evaluated for its logits), when there
    are two prompts or more and it is long enough to be worth sharing; else none."""
    if len(prompts) < 2:
        return []
    first = prompts[0]
    n = min(len(first), *(len(ids) - 1 for ids in prompts))
    for ids in prompts[1:]:
        n = min(n, common_prefix(first, ids))
    return list(first[:n]) if n >= MIN_REUSE else []


class BatchDecoder:
    """One llama.cpp context decoding up to ``parallel`` sequences together, one step at a time.

    :meth:`admit` gives a free slot a request, :meth:`step` runs one forward pass over every
    active sequence and returns each one's new :class:`Token` (and :class:`Done` for those that
    finished, freeing their slots), :meth:`cancel` ends one at once. The batch command drives it
    over a known list, the engine's scheduler over requests that keep arriving."""

    def __init__(self, model: LlamaModel, parallel: int, n_ctx_seq: int, *, reuse_prefix: bool = False) -> None:
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
        self._kept: list[list[int]] = [[] for _ in range(parallel)]  # what each sequence's cells hold
        self._prompts = [0] * parallel  # the length of each sequence's last prompt
        self._n_vocab = int(model.llama.n_vocab())
        self._n_swa = int(llama_cpp.llama_model_n_swa(model.llama._model.model))
        self.reuse_prefix = reuse_prefix
        self._store = model.kv_store if not self._n_swa or params.swa_full else None
        self._spills = reuse_prefix  # the server's slots: cells about to go are kept in the store first
        # speculative decoding: each sequence drafts by prompt lookup (a draft model drafts for one
        # sequence at a time: requests that are batched do not use it)
        self._draft = model.draft if model.draft.mode in ("ngram", "auto") else None
        self._seconds = 0.0  # the last forward pass

    @property
    def free(self) -> int:
        return sum(slot is None for slot in self._slots)

    @property
    def active(self) -> bool:
        return any(self._slots)

    def admit(self, request: BatchRequest, logprobs: int = 0) -> LlmrunError | None:
        """Start ``request`` in the free slot that holds most of its prompt; the error when it
        cannot run (its prompt does not fit)."""
        seq = self._choose(request.ids)
        seed = request.params.run_seed()
        assembler = Assembler.for_request(
            self.model.piece, self.model.is_end, request.ids, self.n_ctx_seq, request.params, seed, request.constraint
        )
        if isinstance(assembler, LlmrunError):
            return assembler
        reused = self._keep(seq, request.ids)
        self._prompts[seq] = len(request.ids)
        assembler.cached_tokens = reused
        window = self.n_ctx_seq if request.params.repeat_last_n == -1 else request.params.repeat_last_n
        sampler = sampler_chain(request.params, seed or 0, self._n_vocab, window)
        pending = list(request.ids[reused:])
        slot = _Slot(seq, request, sampler, assembler, pending, reused, logprobs=logprobs, cached=self._kept[seq])
        if self._store is not None and self._spills:
            slot.keep_at = max(0, self._store.branch(request.ids))
        slot.follows = next(
            (
                other
                for other in self._slots
                if other is not None and other.follows is None and other.pending and other.request.ids == request.ids
            ),
            None,
        )
        if self._draft is not None:
            slot.lookup = PromptLookup(prompt_tokens=len(request.ids))
            slot.gate = Gate() if self._draft.mode == "auto" else None
        self._slots[seq] = slot
        return None

    def _choose(self, ids: Sequence[int]) -> int:
        """The free sequence whose cells share the longest prefix with ``ids`` (the emptiest on a tie)."""
        free = [seq for seq, slot in enumerate(self._slots) if slot is None]
        if not self.reuse_prefix:
            return free[0]
        return max(free, key=lambda seq: (common_prefix(self._kept[seq], ids), -len(self._kept[seq])))

    def _keep(self, seq: int, ids: Sequence[int]) -> int:
        """Drop the cells of ``seq`` past what ``ids`` can reuse (kept in the KV store first, when it wants
        them), or take a longer prefix from the store; how many positions are kept."""
        import llama_cpp

        kept = reusable(self._kept[seq], ids) if self.reuse_prefix else 0
        if len(self._kept[seq]) - kept >= MIN_SAVE:  # a conversation's cells about to be overwritten
            self._spill(seq)
        exact = False  # the cells are a kept state taken whole: what the saving process went on from
        if self._store is not None:
            from llmrun.backends.gguf_state import restore_into

            restored = restore_into(self._store, self._ctx.ctx, seq, ids, kept)
            if restored is not None:
                self._kept[seq][:] = restored[0]
                kept = restored[1]
                exact = kept == len(restored[0])
        if kept and not self._ctx.kv_cache_seq_rm(seq, kept, -1):
            kept = 0  # a memory that cannot drop a tail (recurrent models)
        if kept and not exact:
            pos_min = llama_cpp.llama_memory_seq_pos_min(self._ctx.memory, seq)
            kept = kept if window_intact(pos_min, kept, self._n_swa) else 0
        if not kept:
            self._ctx.kv_cache_seq_rm(seq, -1, -1)
        del self._kept[seq][kept:]
        return kept

    def _join_leaders(self) -> None:
        """A slot waiting on another with the same prompt (``n`` choices of one request) takes its cells and
        samples its first token from the same logits row once that prompt is evaluated; when the other went
        first (cancelled), it evaluates its own prompt from the next step."""
        for slot in self._slots:
            leader = slot.follows if slot is not None else None
            if slot is None or leader is None:
                continue
            if not any(other is leader for other in self._slots):
                slot.follows = None
            elif not leader.pending and leader.sample_at is not None:
                self._ctx.kv_cache_seq_rm(slot.seq, -1, -1)
                self._ctx.kv_cache_seq_cp(leader.seq, slot.seq, -1, -1)  # the whole sequence: every stream allows it
                slot.cached[:] = leader.cached
                slot.pos, slot.pending, slot.sample_at = leader.pos, [], leader.sample_at
                slot.assembler.cached_tokens = len(slot.request.ids)
                slot.follows = None

    def _keep_points(self) -> None:
        """Keep the cells of each prompt that reached the point the KV store wants (``_Slot.keep_at``)."""
        for slot in self._slots:
            if slot is not None and slot.keep_at and slot.pos == slot.keep_at and self._store is not None:
                from llmrun.backends.gguf_state import keep

                keep(self._store, self._ctx.ctx, slot.seq, slot.cached[: slot.pos])
                slot.keep_at = 0

    def _spill(self, seq: int) -> None:
        """Keep the cells of ``seq`` in the KV store (when it wants them) before they are overwritten."""
        if self._spills and self._store is not None and self._kept[seq]:
            from llmrun.backends.gguf_state import keep

            keep(self._store, self._ctx.ctx, seq, self._kept[seq], replace_shorter=True)

    def _spill_prompt(self, seq: int) -> None:
        """When the store uses its prefixes whole (a sliding window), also keep the cells of the last prompt
        of ``seq`` (less its last token) apart from its answer, so the same prompt finds them (the cells go)."""
        point = self._prompts[seq] - 1
        if not (self._spills and self._store is not None and self._store.whole and 0 < point < len(self._kept[seq])):
            return
        if self._store.wanted(self._kept[seq][:point]):
            from llmrun.backends.gguf_state import seq_state

            self._ctx.kv_cache_seq_rm(seq, point, -1)
            del self._kept[seq][point:]
            self._store.save(self._kept[seq], seq_state(self._ctx.ctx, seq))

    def share(self, prefix: Sequence[int]) -> None:
        """Put the cells of ``prefix`` in every sequence before any request is admitted: taken from the KV
        store as far as it holds them, the rest evaluated once (and kept in the store when it wants it).
        The sequences then reuse what they keep, like the server's slots."""
        if self.active or not prefix or len(prefix) >= self.n_ctx_seq:
            return
        held = 0
        if self._store is not None:
            from llmrun.backends.gguf_state import restore_into

            restored = restore_into(self._store, self._ctx.ctx, 0, prefix, 0, prompt=False)
            if restored is not None:
                held = restored[1]
                self._ctx.kv_cache_seq_rm(0, held, -1)
        for start in range(held, len(prefix), N_BATCH):
            chunk = prefix[start : start + N_BATCH]
            for offset, token in enumerate(chunk):
                _put(self._batch.batch, offset, token, start + offset, 0, False)
            self._batch.batch.n_tokens = len(chunk)
            self._ctx.decode(self._batch)
        self._kept[0][:] = prefix
        if held < len(prefix) and self._store is not None:
            from llmrun.backends.gguf_state import keep

            keep(self._store, self._ctx.ctx, 0, prefix)
        for seq in range(1, len(self._slots)):
            self._ctx.kv_cache_seq_rm(seq, -1, -1)
            self._ctx.kv_cache_seq_cp(0, seq, -1, -1)
            self._kept[seq][:] = prefix
        self.reuse_prefix = True

    def step(self) -> list[tuple[int, Token | Done]]:
        """One forward pass: each sequence's next token (when it shows text) and the Done of each that ended."""
        events: list[tuple[int, Token | Done]] = []
        self._draw_up()
        _fill(self._batch.batch, self._slots)
        began = time.perf_counter()
        self._ctx.decode(self._batch)
        self._seconds = time.perf_counter() - began
        self._keep_points()
        self._join_leaders()
        for seq, slot in enumerate(self._slots):
            if slot is None or slot.sample_at is None:
                continue
            first, drafts = slot.sample_at, slot.drafts
            kept = 0
            for row in range(first, first + len(drafts) + 1):
                slot.sample_at = row
                token_id = self._sample(slot)
                if slot.assembler.finish is not None or row == first + len(drafts) or token_id != drafts[row - first]:
                    break
                kept += 1
            if slot.gate is not None and self._batch.batch.n_tokens == len(drafts) + 1:
                slot.gate.record(len(drafts), kept, self._seconds)  # timed: this sequence had the pass alone
            if drafts:
                self._keep_draft(slot, kept)
            events += [(slot.request.index, token) for token in slot.shown]
            slot.shown = []
            if slot.assembler.finish is not None:
                events += self._finish(seq)
        return events

    def _sample(self, slot: _Slot) -> int:
        """The slot's token from the logits at its ``sample_at`` row, accounted for (shown tokens kept in ``shown``)."""
        assert slot.sample_at is not None
        token_id = sample_row(self._ctx, slot.sampler, slot.sample_at, self._n_vocab, slot.assembler.constraint)
        token = slot.assembler.push(token_id, self._scorer(slot) if slot.logprobs else None)
        slot.last = token_id
        if token is not None:
            slot.shown.append(token)
        return token_id

    def _draw_up(self) -> None:
        """Speculative decoding: each generating sequence's draft for this step (prompt lookup over its
        prompt and answer so far), within its context, its token budget and the batch."""
        active = sum(1 for slot in self._slots if slot is not None)
        room_in_batch = N_BATCH - active
        # auto: with two sequences or more the batch already shares each weight read, and on a CPU the
        # drafted positions cost more than they save (benchmarks/bench_spec.py); ngram drafts regardless
        if self._draft is not None and self._draft.mode == "auto" and active > 1:
            room_in_batch = 0
        for slot in self._slots:
            if slot is None:
                continue
            slot.drafts = []
            if slot.lookup is None or slot.pending or slot.last is None or room_in_batch <= 0:
                continue
            assert self._draft is not None
            a = slot.assembler
            room = min(self._draft.tokens, self.n_ctx_seq - slot.pos - 2, a.limit - a.generated - 1, room_in_batch)
            if slot.gate is not None:
                room = slot.gate.length(room)
            if room <= 0:
                continue
            slot.drafts = slot.lookup.propose([*slot.cached[: slot.pos], slot.last], room)[:room]
            room_in_batch -= len(slot.drafts)

    def _keep_draft(self, slot: _Slot, kept: int) -> None:
        """Drop the cells of the drafted tokens the model refused (the step put ``last`` and the draft in)."""
        drafted = len(slot.drafts)
        slot.assembler.tally.record(drafted, kept)
        refused = drafted - kept
        if refused:
            slot.pos -= refused
            del slot.cached[slot.pos :]
            self._ctx.kv_cache_seq_rm(slot.seq, slot.pos, -1)

    def cancel(self, index: int) -> Done | None:
        """End the sequence of request ``index`` now (its text so far); None when it is not running."""
        for seq, slot in enumerate(self._slots):
            if slot is not None and slot.request.index == index:
                return next(event for _, event in self._finish(seq) if isinstance(event, Done))
        return None

    def close(self) -> None:
        for seq, slot in enumerate(self._slots):
            if slot is not None:
                _free(slot)
            elif self.reuse_prefix:
                self._spill(seq)
                self._spill_prompt(seq)
        self._slots = [None] * len(self._slots)
        self._kept = [[] for _ in self._slots]
        self._batch.close()
        self._ctx.close()

    def _finish(self, seq: int) -> list[tuple[int, Token | Done]]:
        slot = self._slots[seq]
        assert slot is not None
        tail, done = slot.assembler.close()
        _free(slot)
        if not self.reuse_prefix:
            self._ctx.kv_cache_seq_rm(seq, -1, -1)
            self._kept[seq].clear()
        self._slots[seq] = None
        index = slot.request.index
        return ([(index, tail)] if tail is not None else []) + [(index, done)]

    def _scorer(self, slot: _Slot) -> Any:
        from llmrun.decoding.assembler import score

        assert slot.sample_at is not None
        row = self._logits(slot.sample_at)
        return lambda token_id: score(row, token_id, slot.logprobs, self.model.piece)

    def _logits(self, index: int) -> Any:
        """The logits row of batch position ``index`` (a view of llama.cpp's buffer)."""
        import numpy as np

        return np.ctypeslib.as_array(self._ctx.get_logits_ith(index), shape=(self._n_vocab,))


def _fill(b: Any, slots: list[_Slot | None]) -> None:
    """One step's batch: a token for each generating sequence, then prompt chunks."""
    n = 0
    for slot in slots:
        if slot is not None and not slot.pending and slot.last is not None:
            slot.sample_at = n
            for token in (slot.last, *slot.drafts):  # the next token, then its draft (speculative decoding)
                _put(b, n, token, slot.pos, slot.seq, True)
                slot.cached.append(token)
                slot.pos += 1
                n += 1
        elif slot is not None:
            slot.sample_at = None
    for slot in slots:
        if slot is None or not slot.pending or slot.follows is not None or n >= N_BATCH:
            continue
        room = N_BATCH - n if slot.keep_at <= slot.pos else min(N_BATCH - n, slot.keep_at - slot.pos)
        chunk = slot.pending[:room]
        del slot.pending[: len(chunk)]
        slot.cached.extend(chunk)
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


def _free(slot: _Slot) -> None:
    """Release a finished sequence's sampler; its cells stay for the next request to reuse."""
    with contextlib.suppress(Exception):
        slot.sampler.close()
