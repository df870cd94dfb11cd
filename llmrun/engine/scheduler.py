"""Many requests at once on one model: continuous batching across callers.

A :class:`Scheduler` owns one model's decoder on a thread of its own. Callers
:meth:`~Scheduler.submit` requests from any thread; each gets its events — Token
after Token, then one :class:`~llmrun.engine.result.Result` (or the error that
stopped it) — through its ``sink``, called on the scheduler's thread. A request
joins the running batch as soon as a slot is free (no waiting for the others to
finish) and :meth:`Ticket.cancel` frees its slot before the next decode step.

GGUF models decode up to ``parallel`` sequences in one llama.cpp batch
(:class:`~llmrun.backends.gguf_batch.BatchDecoder`), MLX models through mlx-lm's
BatchGenerator (:class:`~llmrun.backends.mlx_batch.MlxBatchDecoder`); a backend
without batching, or settings it cannot batch, run one at a time through
:class:`SequentialDecoder`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmrun.backends.base import Decoder, GeneratesBatch, SeesImages, Speculates
from llmrun.decoding.assembler import token_budget
from llmrun.decoding.events import BatchRequest, Done, GenerationStats, Token
from llmrun.decoding.reasoning import Splitter
from llmrun.engine.core import LoadedEntry
from llmrun.engine.load import local
from llmrun.engine.request import Prepared, Request, finish, request_constraint, request_ids
from llmrun.engine.result import Result, TokenLogprob
from llmrun.errors import LlmrunError, ShuttingDown, UsageError

log = logging.getLogger("llmrun.scheduler")

if TYPE_CHECKING:
    from llmrun.backends.base import LoadedModel
    from llmrun.structured.grammar import Constraint

Event = Token | Result | LlmrunError
Sink = Callable[[Event], None]


class QueueFull(LlmrunError):
    """More requests are waiting than the scheduler accepts (or it is stopping)."""


class Unloading(QueueFull):
    """The model is being unloaded (its keep-alive ran out, or room was made for another): a request that
    found it a moment before can load it again and retry."""


class SequentialDecoder:
    """One request at a time through the backend's own stream (for backends without batching)."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        # the current request: its index, its stream, and what it has streamed (for an answer cut short)
        self._current: tuple[int, Iterator[Token | Done], _SoFar] | None = None

    @property
    def free(self) -> int:
        return 0 if self._current else 1

    @property
    def active(self) -> bool:
        return self._current is not None

    def admit(self, request: BatchRequest, logprobs: int = 0) -> LlmrunError | None:
        if request.images:
            assert isinstance(self.model, SeesImages)
            events = self.model.stream_images(
                request.ids,
                request.image_at,
                request.images,
                request.params,
                logprobs=logprobs,
                constraint=request.constraint,
            )
        else:
            events = self.model.stream(request.ids, request.params, logprobs=logprobs, constraint=request.constraint)
        self._current = (request.index, iter(events), _SoFar(request))
        return None

    def step(self) -> list[tuple[int, Token | Done]]:
        assert self._current is not None
        index, events, so_far = self._current
        try:
            event = next(events)
        except LlmrunError as exc:
            self._current = None
            raise _RequestFailed(index, exc) from exc
        if isinstance(event, Done):
            self._current = None
        else:
            so_far.add(event)
        return [(index, event)]

    def cancel(self, index: int) -> Done | None:
        """End the current request now: its answer so far (None when it is not the one running)."""
        if self._current is None or self._current[0] != index:
            return None
        _, events, so_far = self._current
        close = getattr(events, "close", None)
        if close is not None:
            close()
        self._current = None
        return so_far.done()

    def close(self) -> None:
        if self._current is not None:
            self.cancel(self._current[0])


class _SoFar:
    """The tokens a request has streamed, and when: its Done when the stream is ended early."""

    def __init__(self, request: BatchRequest) -> None:
        self.request = request
        self.started = time.perf_counter()
        self.first: float | None = None
        self.text: list[str] = []
        self.count = 0

    def add(self, token: Token) -> None:
        self.first = self.first if self.first is not None else time.perf_counter()
        self.text.append(token.text)
        self.count += 1

    def done(self) -> Done:
        now = time.perf_counter()
        first = self.first if self.first is not None else now
        stats = GenerationStats(
            prompt_tokens=len(self.request.ids),
            generated_tokens=self.count,
            prompt_seconds=first - self.started,
            generation_seconds=now - first,
            finish_reason="length",
            seed=self.request.params.seed,
        )
        return Done("".join(self.text), stats)


class _RequestFailed(Exception):
    def __init__(self, index: int, error: LlmrunError) -> None:
        self.index = index
        self.error = error


@dataclass(eq=False)
class Ticket:
    """A submitted request: ``cancel`` ends it (a client went away); nothing more reaches its sink."""

    index: int
    request: Request
    prepared: Prepared
    sink: Sink
    constraint: Constraint | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    cancelled: bool = False
    deadline: float | None = None  # time.monotonic() past which the request ends (the server's --request-timeout)
    _scheduler: Scheduler | None = None
    splitter: Splitter = field(init=False)  # a reasoning model's answer, told apart as it streams

    def __post_init__(self) -> None:
        self.splitter = Splitter(self.prepared.thinking)

    def cancel(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel(self)


class TimedOut(LlmrunError):
    """A request that waited for a slot until its time was up."""


class Scheduler:
    """``timeout``: the seconds a request may take from its submission (None: no limit). One still
    waiting for a slot then fails (:class:`TimedOut`); one being decoded ends with the answer so far,
    its finish reason ``time``, and frees its slot."""

    def __init__(
        self,
        entry: LoadedEntry,
        parallel: int,
        n_ctx_seq: int,
        max_queue: int = 64,
        *,
        cache_prompts: bool = True,
        timeout: float | None = None,
    ) -> None:
        self.entry = entry
        self.timeout = timeout
        self.model = local(entry.model, "decode requests here")
        self.cache_prompts = cache_prompts  # a finished request's KV cells serve the next that shares their prefix
        self.parallel = parallel
        self.n_ctx_seq = n_ctx_seq
        self.max_queue = max_queue
        self._decoder = self._new_decoder()
        self.batching = not isinstance(self._decoder, SequentialDecoder)
        # requests with images go one at a time through the model's own context, beside the batch
        self._images = self._decoder if not self.batching else SequentialDecoder(self.model)
        self._waiting: deque[Ticket] = deque()
        self._running: dict[int, Ticket] = {}
        self._cancelled: list[Ticket] = []
        self._next = 0
        self._closing = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"llmrun scheduler {entry.name}", daemon=True)
        self._thread.start()

    def _new_decoder(self) -> Decoder:
        model = self.model
        decoder = None
        if isinstance(model, GeneratesBatch) and self.parallel > 1 and not self._drafts_alone:
            decoder = model.batch_decoder(self.parallel, self.n_ctx_seq, reuse_prefix=self.cache_prompts)
        return decoder if decoder is not None else SequentialDecoder(model)

    @property
    def _drafts_alone(self) -> bool:
        """A draft model (speculative decoding) follows one sequence: such a model serves one request at a time."""
        return isinstance(self.model, Speculates) and self.model.drafts_alone

    @property
    def unbatched(self) -> str:
        """Why requests run one at a time here ('' when they are batched)."""
        if self.batching:
            return ""
        if self.parallel == 1:
            return "`parallel` 1"
        if self._drafts_alone:
            return "its draft model drafts for one request at a time"
        if isinstance(self.model, GeneratesBatch):
            return self.model.batch_unsupported or "this backend does not batch"
        return "this backend does not batch"

    # --- callers' side (any thread) ---------------------------------------------------
    def submit(self, request: Request, sink: Sink) -> Ticket:
        """Queue ``request``; its events go to ``sink``. Raises QueueFull, or the prompt's own error."""
        if request.has_images and not (isinstance(self.model, SeesImages) and self.model.sees_images):
            raise UsageError(
                f"{self.entry.name} does not see images: it was loaded without a projector",
                "serve a vision model with its projector (`mmproj`)",
            )
        with self.entry.lock:  # tokenization shares the model with nothing that decodes in parallel
            if self._closing:  # (checked under the entry's lock: an unload waits for it, so the model is there)
                raise Unloading(f"{self.entry.name} is being unloaded", "retry: it is loaded again on demand")
            prepared, positions = self._measured(request)
            n_ctx = self.model.n_ctx if prepared.images else self.n_ctx_seq  # images use the model's own context
            token_budget(positions, n_ctx, request.params)  # a prompt too long fails now
            constraint = request_constraint(self.model, self.entry.templates, request, prepared)
        with self._wake:
            if self._closing or not self._thread.is_alive():
                raise Unloading(f"{self.entry.name} is being unloaded", "retry: it is loaded again on demand")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting", "retry in a moment")
            deadline = time.monotonic() + self.timeout if self.timeout is not None else None
            ticket = Ticket(self._next, request, prepared, sink, constraint, deadline=deadline, _scheduler=self)
            self.entry.last_used = time.monotonic()
            self._next += 1
            self._waiting.append(ticket)
            self._wake.notify()
        return ticket

    def measure(self, request: Request) -> int:
        """The positions ``request``'s prompt takes (its tokens and its images'): what a generation of it
        reads, without generating (Anthropic's count_tokens)."""
        with self.entry.lock:
            return self._measured(request)[1]

    def _measured(self, request: Request) -> tuple[Prepared, int]:
        prepared = request_ids(self.model, self.entry.templates, request)
        positions = len(prepared.ids)
        if prepared.images:
            assert isinstance(self.model, SeesImages)
            positions += sum(self.model.image_positions(image) for image in prepared.images)
        return prepared, positions

    def cancel(self, ticket: Ticket) -> None:
        with self._wake:
            if ticket.cancelled:
                return
            ticket.cancelled = True
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            else:
                self._cancelled.append(ticket)
            self._wake.notify()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> int:
        return len(self._running)

    def close(self) -> None:
        """Stop: requests still waiting or running get an error event."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()

    def stop_if_idle(self) -> bool:
        """Stop taking requests if none is waiting or running, in one step with :meth:`submit`'s own check (a
        request queued a moment before keeps the model; one coming after is told it is being unloaded).
        :meth:`close` then finishes the stop."""
        with self._wake:
            if self._waiting or self._running:
                return False
            self._closing = True
            self._wake.notify()
            return True

    # --- the scheduler's thread ------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._next_step():
                self._step()
        finally:
            stopped = ShuttingDown("the server is shutting down", "retry against another server")
            for ticket in [*self._waiting, *self._running.values()]:
                if not ticket.cancelled:
                    ticket.sink(stopped)
            self._waiting.clear()
            self._running.clear()
            self._decoder.close()
            self._images.close()

    def _next_step(self) -> bool:
        """Admit waiting requests and drop cancelled ones; False when closing."""
        with self._wake:
            while not self._closing and not self._waiting and not self._running and not self._cancelled:
                self._wake.wait()
            if self._closing:
                return False
            for ticket in self._cancelled:
                self._cancel(ticket.index)
                self._running.pop(ticket.index, None)
            self._cancelled.clear()
            self._end_overdue(time.monotonic())
            for ticket in list(self._waiting):  # in order; one with images waits for the image decoder alone
                decoder = self._images if ticket.prepared.images else self._decoder
                if not decoder.free:
                    if decoder is self._decoder and self._decoder is not self._images:
                        break  # the batch is full: text requests keep their order
                    continue
                self._waiting.remove(ticket)
                prepared = ticket.prepared
                error = decoder.admit(
                    BatchRequest(
                        ticket.index,
                        prepared.ids,
                        ticket.request.params,
                        ticket.constraint,
                        prepared.images,
                        prepared.prompt.images,
                    ),
                    ticket.request.logprobs,
                )
                if error is not None:
                    ticket.sink(error)
                else:
                    self._running[ticket.index] = ticket
            return True

    def _cancel(self, index: int) -> Done | None:
        """End a running request in whichever decoder has it: its answer so far (None: not running)."""
        done = self._decoder.cancel(index)
        if done is None and self._images is not self._decoder:
            done = self._images.cancel(index)
        return done

    def _end_overdue(self, now: float) -> None:
        """Requests past their deadline: those waiting fail, those decoding end with their answer so far."""
        if self.timeout is None:
            return
        for ticket in [t for t in self._waiting if t.deadline is not None and now >= t.deadline]:
            self._waiting.remove(ticket)
            ticket.sink(
                TimedOut("the request waited for a slot for its whole time", "retry when the server is less busy")
            )
        for ticket in [t for t in self._running.values() if t.deadline is not None and now >= t.deadline]:
            done = self._cancel(ticket.index)
            if done is None:  # the decoder has finished it already: its Done comes with the next step
                continue
            del self._running[ticket.index]
            self._finish(ticket, Done(done.text, dataclasses.replace(done.stats, finish_reason="time")))

    def _finish(self, ticket: Ticket, done: Done) -> None:
        logprobs = tuple(ticket.logprobs) if ticket.request.logprobs else None
        held = ticket.splitter.flush()
        if held is not None:
            ticket.sink(held)
        ticket.sink(finish(done, self.entry.templates, ticket.request, ticket.prepared, logprobs))

    def _step(self) -> None:
        self._step_one(self._decoder)
        if self._images is not self._decoder:
            self._step_one(self._images)

    def _step_one(self, decoder: Decoder) -> None:
        if not decoder.active:
            return
        try:
            events = decoder.step()
        except _RequestFailed as failed:
            ticket = self._running.pop(failed.index, None)
            if ticket is not None and not ticket.cancelled:
                ticket.sink(failed.error)
            return
        except Exception as exc:  # a failed decode: fail what was running, start a fresh decoder, keep serving
            log.exception("decode step failed")
            error = LlmrunError(f"the model failed while decoding: {exc}", "retry; the server log has the details")
            for ticket in self._running.values():
                if not ticket.cancelled:
                    ticket.sink(error)
            self._running.clear()
            self._decoder.close()
            self._images.close()
            self._decoder = self._new_decoder()
            self._images = self._decoder if not self.batching else SequentialDecoder(self.model)
            return
        for index, event in events:
            ticket = self._running.get(index)
            if ticket is None or ticket.cancelled:
                continue
            if isinstance(event, Done):
                del self._running[index]
                self._finish(ticket, event)
                continue
            if ticket.request.logprobs and event.id >= 0:
                ticket.logprobs.append(TokenLogprob.of(event, self.model.token_bytes(event.id)))
            ticket.sink(ticket.splitter.token(event))
