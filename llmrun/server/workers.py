"""Slow work off the event loop, a bounded amount at a time.

Rendering a template, tokenizing a long prompt, decoding an image, compiling a grammar, loading a model,
embedding: each runs in a worker thread, so ``/health``, every stream and every other client go on
meanwhile. Each kind of work has a limit on how much of it runs or waits at once; past it the request is
a 503 with ``Retry-After`` (the client retries) instead of a thread more: a flood of one kind of request
never takes the threads every other request needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from starlette.concurrency import run_in_threadpool

from llmrun.api.errors import ApiError

P = ParamSpec("P")
T = TypeVar("T")


class Workers:
    """At most ``limit`` calls of one kind of work in worker threads at once (counted on the event loop,
    which is one thread: no lock needed)."""

    def __init__(self, what: str, limit: int) -> None:
        self.what = what
        self.limit = limit
        self.running = 0

    def busy(self) -> ApiError:
        return ApiError(
            503,
            f"the server is busy: {self.running} requests are already {self.what}; retry in a moment",
            code="server_busy",
            headers={"Retry-After": "1"},
        )

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self.running >= self.limit:
            raise self.busy()
        self.running += 1
        try:
            return await run_in_threadpool(function, *args, **kwargs)
        finally:
            self.running -= 1
