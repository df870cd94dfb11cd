"""The engine: models loaded by name and kept, requests completed on them.

One lock per loaded model: a model's KV state serves one request at a time on the
single-sequence path (:meth:`Engine.complete`); many requests at once go through
continuous batching (:meth:`Engine.complete_many` for a known set, the
:class:`~llmrun.engine.scheduler.Scheduler` for requests that keep arriving).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmrun.backends.base import KeepsKv, SeesImages, batching
from llmrun.decoding.events import BatchRequest, Done, Token
from llmrun.decoding.reasoning import Splitter
from llmrun.engine.load import Loaded, load
from llmrun.engine.once import MadeOnce
from llmrun.engine.request import (
    Prepared,
    Request,
    Templates,
    choose_template,
    finish,
    request_constraint,
    request_ids,
)
from llmrun.engine.result import Result, TokenLogprob
from llmrun.errors import LlmrunError, UsageError
from llmrun.remote.model import RemoteModel

if TYPE_CHECKING:
    from llmrun.engine.plan import RunPlan


@dataclass
class LoadedEntry:
    plan: RunPlan
    model: Loaded
    templates: Templates
    load_seconds: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.plan.model.name


class Engine:
    """Loaded models by name, kept until :meth:`unload` (the server unloads idle ones after stopping
    their schedulers: ``ServerState.expire``); ``template`` (a template and where it came from, from
    ``--template``) replaces the models' own."""

    def __init__(
        self,
        *,
        template: tuple[str, str] | None = None,
        loader: Callable[[RunPlan], Loaded] | None = None,
    ) -> None:
        self._template = template
        self._loader = loader or load
        self._entries: dict[str, LoadedEntry] = {}
        self._lock = threading.Lock()  # the table only: held for lookups, never through a load
        self._made = MadeOnce(self._entries, self._lock)

    # --- model lifetime ------------------------------------------------------------
    def load(self, run_plan: RunPlan) -> LoadedEntry:
        """The loaded model for a plan (loaded now unless it already is)."""

        def make() -> LoadedEntry:
            started = time.perf_counter()
            model = self._loader(run_plan)
            return LoadedEntry(
                run_plan, model, choose_template(run_plan, self._template), time.perf_counter() - started
            )

        entry = self._made.get(run_plan.model.name, make)  # one load per name; other names meanwhile
        entry.last_used = time.monotonic()
        return entry

    def loaded(self) -> list[LoadedEntry]:
        with self._lock:
            return list(self._entries.values())

    def unload(self, name: str) -> bool:
        with self._lock:
            entry = self._entries.pop(name, None)
        if entry is None:
            return False
        with entry.lock:
            entry.model.close()
        return True

    def close(self) -> None:
        for entry in self.loaded():
            self.unload(entry.name)

    # --- requests ----------------------------------------------------------------
    def complete(self, entry: LoadedEntry, request: Request) -> Generator[Token | Result, None, None]:
        """Stream one request: Token events, then one Result."""
        entry.last_used = time.monotonic()
        if isinstance(entry.model, RemoteModel):  # the endpoint renders, samples and schedules
            yield from generate(entry.model, entry.templates, request)
            return
        with entry.lock:
            yield from generate(entry.model, entry.templates, request)
            entry.last_used = time.monotonic()

    def complete_many(
        self, entry: LoadedEntry, requests: Sequence[Request], parallel: int, n_ctx_seq: int
    ) -> Generator[tuple[int, Result | LlmrunError], None, None]:
        """Results as requests finish (not in order), keyed by their position in ``requests``;
        a request that cannot run (its prompt does not fit, …) yields its error instead. On a remote
        model, ``parallel`` is the requests in flight per endpoint (0: what each endpoint reports)."""
        if isinstance(entry.model, RemoteModel):
            from llmrun.remote.fleet import complete_many  # threads and queues: only for a fleet

            yield from complete_many(entry.model, requests, parallel or None)
            return
        model = entry.model
        with entry.lock:
            batch: list[BatchRequest] = []
            prepared: dict[int, Prepared] = {}
            with_images = [index for index, request in enumerate(requests) if request.has_images]
            for index, request in enumerate(requests):
                if request.has_images:
                    continue  # one at a time through the model's own context, after the batch
                try:
                    prepared[index] = request_ids(model, entry.templates, request)
                    constraint = request_constraint(model, entry.templates, request, prepared[index])
                except LlmrunError as exc:
                    yield index, exc
                    continue
                batch.append(BatchRequest(index, prepared[index].ids, request.params, constraint))
            if batch:
                outcomes = batching(model, "decode several requests at once").generate_batch(batch, parallel, n_ctx_seq)
                try:
                    for outcome in outcomes:
                        if outcome.done is None:
                            yield outcome.index, outcome.error or LlmrunError("the request failed")
                        else:
                            request = requests[outcome.index]
                            prepared_ = prepared[outcome.index]
                            yield outcome.index, finish(outcome.done, entry.templates, request, prepared_)
                finally:
                    outcomes.close()  # the batch context goes before the model can, even on Ctrl-C
            for index in with_images:
                try:
                    results = [e for e in generate(model, entry.templates, requests[index]) if isinstance(e, Result)]
                    yield index, results[-1]
                except LlmrunError as exc:
                    yield index, exc
            entry.last_used = time.monotonic()


def generate(
    model: Loaded, templates: Templates, request: Request, prepared: Prepared | None = None
) -> Generator[Token | Result, None, None]:
    """One request's generation (run, through :meth:`Engine.complete`, and chat): the prompt rendered and
    tokenized (or ``prepared`` already), its constraint built, the answer streamed as Token events (a
    reasoning model's reasoning apart from the text), then one Result. A remote engine takes the request
    whole and answers with the same events. Batch and serve interleave many requests in a batch decoder,
    with the same stages on each side of it (``request_ids``, ``request_constraint``, ``finish``)."""
    if isinstance(model, RemoteModel):
        yield from model.complete(request)
        return
    prepared = prepared or request_ids(model, templates, request)
    constraint = request_constraint(model, templates, request, prepared)
    if isinstance(model, KeepsKv):  # a conversation goes on from its answer; a prompt may come again
        model.keep_at("answer" if request.messages else "prompt")
    splitter = Splitter(prepared.thinking)
    logprobs: list[TokenLogprob] = []
    done: Done | None = None
    if prepared.images:
        if not isinstance(model, SeesImages) or not model.sees_images:
            raise UsageError(
                "this model does not see images: it was loaded without a projector",
                "give a vision model's projector with `mmproj` (its mmproj GGUF file)",
            )
        events = model.stream_images(
            prepared.ids,
            prepared.prompt.images,
            prepared.images,
            request.params,
            logprobs=request.logprobs,
            constraint=constraint,
        )
    else:
        events = model.stream(prepared.ids, request.params, logprobs=request.logprobs, constraint=constraint)
    for event in events:
        if isinstance(event, Done):
            done = event
            continue
        if request.logprobs and event.id >= 0:
            logprobs.append(TokenLogprob.of(event, model.token_bytes(event.id)))
        yield splitter.token(event)
    assert done is not None
    held = splitter.flush()
    if held is not None:
        yield held
    yield finish(done, templates, request, prepared, tuple(logprobs) if request.logprobs else None)
