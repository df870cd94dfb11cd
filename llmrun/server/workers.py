"""Slow work off the event loop, a bounded amount at a time.

Rendering a template, tokenizing a long prompt, decoding an image, compiling a grammar, loading a model,
embedding: each runs in a worker thread, so ``/health``, every stream and every other client go on
meanwhile. Each kind of work has its own few threads and a bounded queue in front of them; past the queue
a request is a 503 with ``Retry-After`` (the client retries) instead of another thread: a flood of one kind
of request never takes the threads every other request needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from starlette.concurrency import run_in_threadpool

from llmrun.api.errors import ApiError

P = ParamSpec("P")
T = TypeVar("T")


class Workers:
    """At most ``threads`` calls of one kind of work in worker threads at once, and ``queue`` more waiting
    for one (counted on the event loop, which is one thread: no lock needed)."""

    def __init__(self, what: str, threads: int, queue: int) -> None:
        self.what = what
        self.queue = queue
        self.waiting = 0
        self.running = 0
        self._threads = asyncio.Semaphore(threads)

    def busy(self) -> ApiError:
        return ApiError(
            503,
            f"the server is busy: {self.running + self.waiting} requests are already {self.what}; retry in a moment",
            code="server_busy",
            headers={"Retry-After": "1"},
        )

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self.waiting >= self.queue:
            raise self.busy()
        self.waiting += 1
        try:
            await self._threads.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            return await run_in_threadpool(function, *args, **kwargs)
        finally:
            self.running -= 1
            self._threads.release()
