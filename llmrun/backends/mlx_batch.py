"""Continuous batching on MLX through mlx-lm's own ``BatchGenerator``.

The same contract as the GGUF :class:`~llmrun.backends.gguf_batch.BatchDecoder`:
:meth:`admit` starts a request when a slot is free, :meth:`step` advances every running
sequence by one token (prompt chunks of new ones are processed in the same call),
:meth:`cancel` ends one at once. Each sequence has its own sampler, seeded by its own
key (mlx's global random state would make a seeded answer depend on its companions),
and its own penalty processors; text, stop strings and the end of the answer are
llmrun's (:class:`~llmrun.decoding.assembler.Assembler`), as on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmrun.backends.mlx_parts import PREFILL_STEP, MlxSequenceModel, make_processors, make_sampler
from llmrun.decoding.assembler import Assembler
from llmrun.decoding.events import BatchRequest, Done, Token
from llmrun.errors import LlmrunError


@dataclass
class _Sequence:
    index: int  # the request's key
    assembler: Assembler
    logprobs: int


class MlxBatchDecoder:
    def __init__(self, model: MlxSequenceModel, parallel: int, n_ctx_seq: int) -> None:
        from mlx_lm.generate import BatchGenerator

        self.model = model
        self.parallel = parallel
        self.n_ctx_seq = n_ctx_seq
        self._generator: Any = BatchGenerator(
            model.model,
            completion_batch_size=parallel,
            prefill_batch_size=parallel,
            prefill_step_size=PREFILL_STEP,
        )
        self._running: dict[int, _Sequence] = {}  # by the generator's uid

    @property
    def free(self) -> int:
        return self.parallel - len(self._running)

    @property
    def active(self) -> bool:
        return bool(self._running)

    def admit(self, request: BatchRequest, logprobs: int = 0) -> LlmrunError | None:
        """Queue ``request`` in the generator; the error when it cannot run (its prompt does not fit)."""

        seed = request.params.run_seed()
        model = self.model
        assembler = Assembler.for_request(
            model.token_bytes, model.is_end, request.ids, self.n_ctx_seq, request.params, seed, request.constraint
        )
        if isinstance(assembler, LlmrunError):
            return assembler
        ids = list(request.ids)
        [uid] = self._generator.insert(
            [ids],
            max_tokens=[assembler.limit],
            samplers=[make_sampler(request.params, self.model.vocab_size, seed=seed)],
            logits_processors=[make_processors(request.params, self.n_ctx_seq, len(ids), request.constraint)],
        )
        self._running[uid] = _Sequence(request.index, assembler, logprobs)
        return None

    def step(self) -> list[tuple[int, Token | Done]]:
        """One step of the generator: each generating sequence's next token, and the Done of those that ended."""
        _, responses = self._generator.next()
        events: list[tuple[int, Token | Done]] = []
        for response in responses:
            sequence = self._running.get(response.uid)
            if sequence is None:
                continue
            scorer = _scorer(response.logprobs, sequence.logprobs, self.model) if sequence.logprobs else None
            token = sequence.assembler.push(int(response.token), scorer)
            if token is not None:
                events.append((sequence.index, token))
            if sequence.assembler.finish is not None or response.finish_reason is not None:
                events += self._finish(response.uid)
        return events

    def cancel(self, index: int) -> Done | None:
        for uid, sequence in self._running.items():
            if sequence.index == index:
                return next(event for _, event in self._finish(uid) if isinstance(event, Done))
        return None

    def close(self) -> None:
        if self._running:
            self._generator.remove(list(self._running))
        self._running.clear()
        self._generator.close()

    def _finish(self, uid: int) -> list[tuple[int, Token | Done]]:
        sequence = self._running.pop(uid)
        self._generator.remove([uid])  # a no-op when the generator ended it itself (its max_tokens)
        tail, done = sequence.assembler.close()
        return ([(sequence.index, tail)] if tail is not None else []) + [(sequence.index, done)]


def _scorer(logprobs: Any, n: int, model: MlxSequenceModel) -> Any:
    import mlx.core as mx
    import numpy as np

    from llmrun.decoding.assembler import score

    row = np.array(logprobs.astype(mx.float32), dtype=np.float32).reshape(-1)
    return lambda token_id: score(row, token_id, n, model.token_bytes)
