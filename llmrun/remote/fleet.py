"""Many requests over a fleet of endpoints serving one model.

Each endpoint gets ``slots`` workers (``--parallel``, else the slot count it reports, else
:data:`DEFAULT_SLOTS`), which take the next waiting request: a faster or idler endpoint takes more,
so each request goes to the least busy endpoint. A request that fails retryably on one endpoint (it is
down, overloaded, or cut the answer off) goes back to the queue for another; an endpoint that cannot
be reached stops taking requests. Results come as they finish, keyed by the request's position; a
request that no endpoint could answer comes back as its last error.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmrun.errors import LlmrunError, RemoteError

if TYPE_CHECKING:
    from llmrun.engine.request import Request
    from llmrun.engine.result import Result
    from llmrun.remote.client import Client
    from llmrun.remote.model import RemoteModel

DEFAULT_SLOTS = 4
MAX_SLOTS = 64


def reported_slots(client: Client) -> int | None:
    """The parallel sequences an endpoint says it decodes: ``llmrun serve``'s ``/health`` (``slots``),
    llama-server's ``/props`` (``total_slots``); None when it says nothing."""
    health = client.probe("/health")
    if isinstance(health, dict) and isinstance(health.get("slots"), dict):
        total = health["slots"].get("total")
        if isinstance(total, int) and total > 0:
            return min(total, MAX_SLOTS)
    props = client.probe("/props")
    if isinstance(props, dict) and isinstance(props.get("total_slots"), int) and props["total_slots"] > 0:
        return min(int(props["total_slots"]), MAX_SLOTS)
    return None


@dataclass
class _Pending:
    index: int
    tried: set[int] = field(default_factory=set)  # endpoints that failed it
    error: RemoteError | None = None


class _Board:
    """The waiting requests, which endpoints are still up, and who is working (under one lock)."""

    def __init__(self, count: int, endpoints: int) -> None:
        self.waiting = [_Pending(i) for i in range(count)]
        self.up = set(range(endpoints))
        self.working = 0
        self.stopped = False
        self.changed = threading.Condition()

    def take(self, endpoint: int) -> _Pending | None:
        """The next request this endpoint has not failed; None when there is nothing left for it."""
        with self.changed:
            while True:
                if self.stopped or endpoint not in self.up:
                    return None
                for position, pending in enumerate(self.waiting):
                    if endpoint not in pending.tried:
                        self.working += 1
                        return self.waiting.pop(position)
                if not self.waiting and not self.working:
                    return None
                if not self.working:  # what waits was failed here; the others will take it or none will
                    return None
                self.changed.wait()

    def settle(self) -> None:
        with self.changed:
            self.working -= 1
            self.changed.notify_all()

    def retry(self, pending: _Pending, endpoint: int, error: RemoteError, down: bool) -> bool:
        """Put a failed request back for another endpoint; False when every endpoint up has failed it."""
        with self.changed:
            pending.tried.add(endpoint)
            pending.error = error
            if down:
                self.up.discard(endpoint)
            if self.up - pending.tried:
                self.waiting.insert(0, pending)
                self.working -= 1
                self.changed.notify_all()
                return True
            self.working -= 1
            self.changed.notify_all()
            return False

    def orphans(self) -> list[_Pending]:
        """Requests left waiting that no endpoint up will take."""
        with self.changed:
            left = [p for p in self.waiting if not (self.up - p.tried)] if not self.working else []
            for pending in left:
                self.waiting.remove(pending)
            return left

    def stop(self) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify_all()


def complete_many(
    model: RemoteModel, requests: Sequence[Request], parallel: int | None = None
) -> Generator[tuple[int, Result | LlmrunError], None, None]:
    """Results as requests finish (not in order), keyed by their position in ``requests``."""
    if not requests:
        return
    import queue  # a fleet's threads: not at start-up

    from llmrun.engine.result import Result

    board = _Board(len(requests), len(model.clients))
    out: queue.Queue[tuple[int, Any]] = queue.Queue()

    def work(endpoint: int) -> None:
        while (pending := board.take(endpoint)) is not None:
            try:
                result = None
                for event in model.complete_on(endpoint, requests[pending.index]):
                    if isinstance(event, Result):
                        result = event
                assert result is not None
            except RemoteError as exc:
                if exc.retryable and board.retry(pending, endpoint, exc, exc.down):
                    continue
                if not exc.retryable:
                    board.settle()
                out.put((pending.index, exc))
                continue
            except LlmrunError as exc:
                board.settle()
                out.put((pending.index, exc))
                continue
            except BaseException as exc:  # a bug: reported as the request's failure
                board.settle()
                out.put((pending.index, LlmrunError(f"the request failed: {exc!r}")))
                continue
            board.settle()
            out.put((pending.index, result))
        out.put((-1, None))  # this worker is done

    slots = [parallel or reported_slots(c) or DEFAULT_SLOTS for c in model.clients]
    workers = [
        threading.Thread(target=work, args=(endpoint,), daemon=True, name=f"llmrun-fleet-{endpoint}")
        for endpoint, count in enumerate(slots)
        for _ in range(count)
    ]
    for worker in workers:
        worker.start()
    running, answered = len(workers), set[int]()
    try:
        while len(answered) < len(requests) and running:
            index, outcome = out.get()
            if index < 0:
                running -= 1
                continue
            answered.add(index)
            yield index, outcome
        for pending in board.orphans():
            answered.add(pending.index)
            yield pending.index, pending.error or RemoteError("no endpoint could answer the request")
        for index in sorted(set(range(len(requests))) - answered):
            yield index, RemoteError("no endpoint could answer the request")
    finally:
        board.stop()
