"""The engine's pieces without a model: Request validation, the one Result shape, capabilities,
and the scheduler's queueing, cancellation and shutdown over a backend that only streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmrun.backends.base import batching, evaluating, with_logits
from llmrun.decoding.events import Done, GenerationStats, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.core import LoadedEntry
from llmrun.engine.request import Request, Templates
from llmrun.engine.result import Result
from llmrun.engine.scheduler import QueueFull, Scheduler
from llmrun.errors import InvalidParameter, LlmrunError, UsageError
from llmrun.prompt.template import Message


class TextOnly:
    """A backend that can only stream text (like a remote engine): one token per character."""

    path = Path("text-only")
    n_ctx = 64
    bos_id = None
    eos_id = None
    adds_bos = False

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, ids: Sequence[int], *, special: bool = False) -> str:
        return "".join(map(chr, ids))

    def token_bytes(self, token_id: int, *, special: bool = False) -> bytes:
        return chr(token_id).encode()

    def token_kind(self, token_id: int) -> str:
        return "normal"

    def stream(
        self, ids: Sequence[int], params: SamplingParams, *, logprobs: int = 0, constraint: object = None
    ) -> Iterator[Token | Done]:
        assert constraint is None  # a text-only backend cannot constrain (it has no grammar_tokenizer)
        text = "".join(map(chr, ids))[::-1][: params.max_tokens]
        for c in text:
            time.sleep(self.delay)
            yield Token(ord(c), c)
        yield Done(text, GenerationStats(len(ids), len(text), 0.01, 0.02, "length", params.seed))

    def close(self) -> None:
        pass


def entry(model: TextOnly) -> LoadedEntry:
    plan = SimpleNamespace(model=SimpleNamespace(name="text-only"))
    return LoadedEntry(plan=plan, model=model, templates=Templates(None, "", "none"), load_seconds=0.0)  # type: ignore[arg-type]


def test_a_request_is_a_prompt_or_messages_and_names_bad_fields() -> None:
    assert Request(prompt="hi").prompt == "hi"
    assert Request(messages=(Message("user", "hi"),)).messages
    with pytest.raises(InvalidParameter) as info:
        Request()
    assert info.value.name == "prompt"
    with pytest.raises(InvalidParameter):
        Request(prompt="a", messages=(Message("user", "b"),))
    with pytest.raises(InvalidParameter) as info:
        Request(prompt="a", logprobs=101)
    assert info.value.name == "logprobs"


def test_the_result_shape() -> None:
    done = Done("hi", GenerationStats(5, 2, 0.5, 0.25, "eos", 7, None))
    data = Result.of(done, "chat template").to_dict()
    assert data == {
        "text": "hi",
        "prompt_format": "chat template",
        "tokens": {"prompt": 5, "cached": 0, "generated": 2, "drafted": 0, "accepted": 0},
        "timings": {"time_to_first_token_s": 0.5, "prompt_tokens_per_s": 10.0, "generation_tokens_per_s": 4.0},
        "stop_reason": "eos",
        "stop_string": None,
        "seed": 7,
    }
    assert "logprobs" in Result.of(done, "plain", ()).to_dict()


def test_a_backend_without_a_capability_gets_one_line() -> None:
    model = TextOnly()
    for ask in (with_logits, evaluating, batching):
        with pytest.raises(UsageError) as info:
            ask(model, "do that")
        assert info.value.message == "this model's backend cannot do that"


def collect(scheduler: Scheduler, request: Request) -> tuple[list[Any], threading.Event]:
    events: list[Any] = []
    finished = threading.Event()

    def sink(event: Any) -> None:
        events.append(event)
        if isinstance(event, (Result, LlmrunError)):
            finished.set()

    scheduler.submit(request, sink)
    return events, finished


def test_the_scheduler_runs_requests_one_at_a_time_on_a_streaming_backend() -> None:
    scheduler = Scheduler(entry(TextOnly()), parallel=4, n_ctx_seq=64)
    try:
        assert not scheduler.batching  # no batch decoder: one at a time, and the server says so
        runs = [collect(scheduler, Request(prompt=p, raw=True, params=SamplingParams(max_tokens=3))) for p in "abc"]
        assert all(finished.wait(5) for _, finished in runs)
        texts = ["".join(e.text for e in events if isinstance(e, Token)) for events, _ in runs]
        assert texts == ["a", "b", "c"]
        assert all(isinstance(events[-1], Result) for events, _ in runs)
    finally:
        scheduler.close()


def test_cancel_full_queue_and_shutdown() -> None:
    scheduler = Scheduler(entry(TextOnly(delay=0.05)), parallel=1, n_ctx_seq=64, max_queue=1)
    slow = Request(prompt="x" * 40, raw=True, params=SamplingParams(max_tokens=40))
    first, _ = collect(scheduler, slow)
    time.sleep(0.2)  # running now
    second, _ = collect(scheduler, slow)  # waiting
    with pytest.raises(QueueFull):
        scheduler.submit(slow, lambda event: None)
    scheduler.close()
    assert isinstance(first[-1], LlmrunError) and isinstance(second[-1], LlmrunError)
    assert "shutting down" in first[-1].message
    with pytest.raises(QueueFull):
        scheduler.submit(slow, lambda event: None)


def test_a_cancelled_request_gets_nothing_more() -> None:
    scheduler = Scheduler(entry(TextOnly(delay=0.05)), parallel=1, n_ctx_seq=64)
    try:
        events: list[Any] = []
        ticket = scheduler.submit(
            Request(prompt="y" * 40, raw=True, params=SamplingParams(max_tokens=40)), events.append
        )
        time.sleep(0.2)
        ticket.cancel()
        time.sleep(0.2)
        seen = len(events)
        after, finished = collect(scheduler, Request(prompt="ok", raw=True, params=SamplingParams(max_tokens=2)))
        assert finished.wait(5) and isinstance(after[-1], Result)  # the slot was freed
        assert len(events) == seen and 0 < seen < 40 and not isinstance(events[-1], Result)
    finally:
        scheduler.close()


def test_a_request_past_its_time_ends_with_its_answer_so_far_and_frees_its_slot() -> None:
    """The server's --request-timeout: the running request ends with what it has (finish reason ``time``),
    the one that waited behind it for its whole time fails, and the slot serves the next request."""
    scheduler = Scheduler(entry(TextOnly(delay=0.05)), parallel=1, n_ctx_seq=64, timeout=0.5)
    try:
        slow = Request(prompt="z" * 60, raw=True, params=SamplingParams(max_tokens=60))
        started = time.monotonic()
        running, ran = collect(scheduler, slow)
        waiting, waited = collect(scheduler, slow)
        assert ran.wait(5) and waited.wait(5)
        assert time.monotonic() - started < 2  # 60 tokens at 50 ms would take 3 s
        result = running[-1]
        assert isinstance(result, Result) and result.finish_reason == "time"
        shown = "".join(e.text for e in running if isinstance(e, Token))
        assert result.text == shown and 0 < len(shown) < 60 and result.generated_tokens == len(shown)
        assert isinstance(waiting[-1], LlmrunError) and not isinstance(waiting[-1], Result)
        after, finished = collect(scheduler, Request(prompt="ok", raw=True, params=SamplingParams(max_tokens=2)))
        assert finished.wait(5) and isinstance(after[-1], Result) and after[-1].finish_reason == "length"
    finally:
        scheduler.close()
