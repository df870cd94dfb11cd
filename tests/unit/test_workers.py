"""Slow work off the event loop: a few threads per kind of work, a bounded queue before them, a 503 past it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llmrun.api.errors import ApiError
from llmrun.server.workers import Workers


def test_work_runs_in_threads_queues_and_is_refused_past_the_queue() -> None:
    release = threading.Event()
    threads: set[str] = set()

    def slow(value: int) -> int:
        threads.add(threading.current_thread().name)
        release.wait(5)
        return value * 2

    async def main() -> tuple[list[int], ApiError, float]:
        workers = Workers("testing", threads=1, queue=1)
        loop_thread = threading.current_thread().name
        first = asyncio.create_task(workers.run(slow, 1))
        second = asyncio.create_task(workers.run(slow, 2))  # waits for the one thread
        await asyncio.sleep(0.1)
        assert (workers.running, workers.waiting) == (1, 1)
        with pytest.raises(ApiError) as refused:
            await workers.run(slow, 3)
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(0.05)  # the event loop is free meanwhile
        ticked = asyncio.get_running_loop().time() - started
        release.set()
        done = [await first, await second]
        assert loop_thread not in threads
        assert (workers.running, workers.waiting) == (0, 0)
        assert await workers.run(slow, 4) == 8  # free again
        return done, refused.value, ticked

    done, refused, ticked = asyncio.run(main())
    assert done == [2, 4] and ticked < 1
    assert refused.status == 503 and refused.headers["Retry-After"] == "1" and "testing" in refused.message
