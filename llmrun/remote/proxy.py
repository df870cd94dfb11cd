"""A remote engine behind ``llmrun serve``: a models.toml entry with an ``endpoint``, served as a proxy.

The counterpart of :class:`llmrun.engine.scheduler.Scheduler` for a model that runs elsewhere: the
engine there renders, schedules and batches, so each request goes to it whole, on a thread of its
own, at most ``parallel`` at once (the rest wait in order, up to ``max_queue``); its events reach the
request's sink as they arrive (tokens, then one Result; an error instead when it fails). A request
whose client went away is dropped from the queue, or its stream is closed, which ends it at the
endpoint. ``timeout`` ends a request that waited too long for a slot (``TimedOut``); a full queue is
``QueueFull``: the scheduler's errors, which the server answers alike.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmrun.engine.scheduler import QueueFull, TimedOut, Unloading
from llmrun.errors import LlmrunError, ShuttingDown
from llmrun.remote.model import RemoteModel

if TYPE_CHECKING:
    from llmrun.decoding.events import Token
    from llmrun.engine.core import LoadedEntry
    from llmrun.engine.request import Request
    from llmrun.engine.result import Result

    Sink = Callable[[Token | Result | LlmrunError], None]


@dataclass(eq=False)  # (each ticket is its own: kept in a set by identity)
class ProxyTicket:
    """A request on its way to the endpoint: ``cancel`` ends it (nothing more reaches its sink)."""

    request: Request
    sink: Sink
    deadline: float | None = None
    cancelled: bool = False
    _proxy: RemoteProxy | None = field(default=None, repr=False)

    def cancel(self) -> None:
        if self._proxy is not None:
            self._proxy.cancel(self)


class RemoteProxy:
    """``entry``: the loaded remote model (``entry.model`` a :class:`RemoteModel`)."""

    batching = True  # the engine behind it takes ``parallel`` requests at once
    unbatched = ""

    def __init__(self, entry: LoadedEntry, parallel: int, max_queue: int = 64, *, timeout: float | None = None) -> None:
        self.entry = entry
        if not isinstance(entry.model, RemoteModel):
            raise TypeError(f"{entry.name} runs here, not at an endpoint: it takes a Scheduler")
        self.model = entry.model
        self.parallel = parallel
        self.max_queue = max_queue
        self.timeout = timeout
        self._waiting: deque[ProxyTicket] = deque()
        self._running: set[ProxyTicket] = set()
        self._closing = False
        self._lock = threading.Lock()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> int:
        return len(self._running)

    def submit(self, request: Request, sink: Sink) -> ProxyTicket:
        with self._lock:
            if self._closing:
                raise Unloading(f"{self.entry.name} is being unloaded", "retry: it is loaded again on demand")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting", "retry in a moment")
            deadline = time.monotonic() + self.timeout if self.timeout is not None else None
            ticket = ProxyTicket(request, sink, deadline, _proxy=self)
            self.entry.last_used = time.monotonic()
            self._waiting.append(ticket)
        self._start_waiting()
        return ticket

    def cancel(self, ticket: ProxyTicket) -> None:
        with self._lock:
            ticket.cancelled = True
            if ticket in self._waiting:
                self._waiting.remove(ticket)

    def stop_if_idle(self) -> bool:
        """Stop taking requests if none is waiting or running (see :meth:`Scheduler.stop_if_idle`)."""
        with self._lock:
            if self._waiting or self._running:
                return False
            self._closing = True
            return True

    def close(self) -> None:
        """Stop: requests waiting or running get an error event; running streams are closed."""
        with self._lock:
            self._closing = True
            stopped = [*self._waiting, *self._running]
            self._waiting.clear()
        error = ShuttingDown("the server is shutting down", "retry against another server")
        for ticket in stopped:
            if not ticket.cancelled:
                ticket.cancelled = True
                ticket.sink(error)

    def _start_waiting(self) -> None:
        """A thread for each waiting request a free slot can take."""
        while True:
            with self._lock:
                if not self._waiting or len(self._running) >= self.parallel or self._closing:
                    return
                ticket = self._waiting.popleft()
                self._running.add(ticket)
            threading.Thread(target=self._run, args=(ticket,), name="llmrun proxy", daemon=True).start()

    def _run(self, ticket: ProxyTicket) -> None:
        try:
            if ticket.deadline is not None and time.monotonic() > ticket.deadline:
                raise TimedOut("the request waited for a slot for its whole time", "retry when the server is less busy")
            events = self.model.complete(ticket.request)
            try:
                for event in events:
                    if ticket.cancelled:
                        break
                    ticket.sink(event)
            finally:
                events.close()  # (ends the HTTP stream when the client went away)
        except LlmrunError as exc:
            if not ticket.cancelled:
                ticket.sink(exc)
        finally:
            with self._lock:
                self._running.discard(ticket)
                self.entry.last_used = time.monotonic()
            self._start_waiting()
