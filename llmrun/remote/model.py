"""A model served by an OpenAI-compatible engine elsewhere, over one or more endpoints.

It completes whole requests rather than token ids: the endpoint renders the conversation through the
model's own template and samples; llmrun measures the time to the first token and the decode speed
as the tokens arrive, and takes the token counts from the endpoint's ``usage``. It has none of the
optional capabilities (logits, evaluation, batching of token ids), so ``next``, ``tokenize``, ``eval``
and ``quantize`` say plainly that a remote engine does not offer them. A request that fails before its
first token on one endpoint (down, overloaded, failing) goes to the next.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.decoding.events import Token
from llmrun.errors import RemoteError, UsageError
from llmrun.models.endpoint import Endpoint
from llmrun.remote import wire
from llmrun.remote.client import Client

if TYPE_CHECKING:
    from llmrun.engine.request import Request
    from llmrun.engine.result import Result


class RemoteModel:
    """``extras``: the non-OpenAI sampling settings the user set. All of them are sent (under the engines'
    names) until an endpoint rejects one the user did not set; from then on only those the user set."""

    remote = True

    def __init__(
        self, endpoints: Sequence[Endpoint], *, n_ctx: int, extras: frozenset[str] = frozenset(), retries: int = 3
    ) -> None:
        if not endpoints:
            raise UsageError("a remote model needs at least one endpoint", "pass `endpoint` URL")
        self.endpoints = tuple(endpoints)
        self.clients = [Client(e, retries=retries) for e in endpoints]
        self.path = Path(endpoints[0].url)  # where the model is, for messages
        self.n_ctx = n_ctx
        self.extras = extras
        self.sending = frozenset(wire.EXTRA_FIELDS)
        self._busy = [0] * len(self.clients)
        self._lock = threading.Lock()
        self.served: str | None = endpoints[0].model  # the model's name as the last endpoint to answer serves it

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def complete(self, request: Request) -> Generator[Token | Result, None, None]:
        """Token events as they arrive, then one Result; on the least busy endpoint, and on the next
        when one fails before the answer starts."""
        if request.has_images:
            raise UsageError("images go to a local model with its projector, not to a remote engine yet", "")
        order = sorted(range(len(self.clients)), key=lambda i: self._busy[i])
        for position, index in enumerate(order):
            emitted = False
            try:
                for event in self.complete_on(index, request):
                    emitted = emitted or isinstance(event, Token)
                    yield event
                return
            except RemoteError as exc:
                if not exc.retryable or emitted or position == len(order) - 1:
                    raise

    def complete_on(self, index: int, request: Request) -> Iterator[Token | Result]:
        """The request on one endpoint, without trying another (but again without the settings the user
        did not set, when the endpoint rejects one of those)."""
        sending = self.sending
        try:
            yield from self._complete_on(index, request, sending)
        except RemoteError as exc:
            if exc.setting is None or exc.setting in self.extras or exc.setting not in sending:
                raise
            self.sending = self.extras
            yield from self._complete_on(index, request, self.extras)

    def _complete_on(self, index: int, request: Request, sending: frozenset[str]) -> Iterator[Token | Result]:
        client = self.clients[index]
        with self._lock:
            self._busy[index] += 1
        try:
            started = time.perf_counter()
            body = wire.body(request, client.model(), extras=sending)
            self.served = body["model"]
            assembly = wire.Assembly()
            first: float | None = None
            for kind, data in client.stream(wire.route(request), body):
                if kind == "whole":
                    assembly.whole(data)
                    first = time.perf_counter()
                    if assembly.answer or "".join(assembly.reasoning):
                        yield Token(-1, assembly.answer, reasoning="".join(assembly.reasoning))
                    continue
                token = assembly.chunk(data)
                if token is not None:
                    first = first if first is not None else time.perf_counter()
                    yield token
            if assembly.finish is None:  # the stream ended, but the answer did not
                raise RemoteError(
                    f"{client.endpoint.host} ended the answer without a finish reason, after {assembly.pieces} "
                    "chunks: it dropped the request (llama-cpp-python's server does when another arrives)",
                    "send it one request at a time (`parallel` 1), or try again",
                    retryable=True,
                )
            yield assembly.result(request, first, time.perf_counter(), started)
        finally:
            with self._lock:
                self._busy[index] -= 1
