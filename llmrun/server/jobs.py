"""What every route that runs a model shares: reading the body, finding the model, handing requests
to its scheduler and collecting their events, and the errors a request meets on the way (as
:class:`ApiError`, which the app answers in OpenAI's shape, or in Ollama's under /api/)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from fastapi import Request

from llmrun.api import openai as api
from llmrun.api.errors import ApiError, explain, worded
from llmrun.backends.base import ReadsTokens, outside_vocabulary
from llmrun.engine.result import Result
from llmrun.engine.scheduler import Event, QueueFull, Ticket, TimedOut, Unloading
from llmrun.errors import (
    ContextFull,
    InsufficientMemory,
    LlmrunError,
    ModelNotFound,
    ShuttingDown,
    TemplateError,
    UsageError,
)
from llmrun.remote.proxy import ProxyTicket
from llmrun.server.metrics import Metrics
from llmrun.server.state import Embedding, Served, ServerState
from llmrun.structured.grammar import UnsupportedFormat

Handle = Ticket | ProxyTicket  # a request in a model's scheduler, or on its way to a remote engine


def model_error(state: ServerState, name: str, exc: LlmrunError) -> ApiError:
    if isinstance(exc, InsufficientMemory):
        return ApiError(503, f"model {name!r} cannot be loaded now: {explain(exc)}", code="insufficient_memory")
    if isinstance(exc, UsageError) and not isinstance(exc, ModelNotFound):
        return ApiError(400, explain(exc), param="model", code="model_not_supported")
    message = f"{worded(exc.message)}; this server runs: {', '.join(state.names()) or 'none'}"
    return ApiError(404, message, param="model", code="model_not_found")


def wrong_kind(state: ServerState, name: str, *, embedding: bool) -> None:
    """A text model asked for embeddings, or an embedding model asked for text: a 400 that says which."""
    if embedding and name in {s.name for s in state.served()}:
        raise ApiError(400, f"{name} is a text-generation model; ask it for chat or completions", param="model")
    if not embedding and name in {e.name for e in state.embeddings()}:
        raise ApiError(400, f"{name} is an embedding model; ask it for /v1/embeddings", param="model")


async def json_body(request: Request, limit: int) -> Any:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None


async def served_model(state: ServerState, body: Any) -> Served:
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise ApiError(400, "model is required: a string naming a model this server runs", param="model")
    wrong_kind(state, name, embedding=False)
    loaded = state.find(name)  # most requests: no thread, no queue
    if loaded is not None:
        return loaded
    try:
        return await state.loading.run(state.get, name)
    except LlmrunError as exc:
        raise model_error(state, name, exc) from None


async def embedding_model(state: ServerState, name: str) -> Embedding:
    """The embedding model a client named: at once when loaded, else loaded in a worker thread."""
    loaded = state.find_embedding(name)
    if loaded is not None:
        return loaded
    try:
        return await state.loading.run(state.get_embedding, name)
    except LlmrunError as exc:
        raise model_error(state, name, exc) from None


def sees_images(served: Served) -> bool:
    """Whether the served model reads images (it was loaded with a projector)."""
    from llmrun.backends.base import SeesImages

    model = served.scheduler.entry.model
    return isinstance(model, SeesImages) and model.sees_images


async def submit(
    state: ServerState, served: Served, call: api.Call
) -> tuple[asyncio.Queue[tuple[int, Event]], list[Handle]]:
    """Every request of the call into the model's scheduler, in a worker thread (rendering, tokenizing,
    reading images and compiling grammars happen there, never on the event loop); events come back
    tagged with their choice. Requests whose caller is gone before they are queued are cancelled. A model
    unloaded between the request finding it and queueing there (its keep-alive ran out, or it made room for
    another) is loaded again, once."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
    tickets: list[Handle] = []
    abandoned = threading.Event()

    def sink_for(index: int) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(queue.put_nowait, (index, event))

        return sink

    def submit_all(target: Served) -> None:
        try:
            for index, request in enumerate(call.requests):
                tickets.append(target.scheduler.submit(request, sink_for(index)))
                if abandoned.is_set():
                    raise ClientGone
        except BaseException:
            cancel(tickets)
            raise

    target = served
    for attempt in range(2):
        try:
            await state.preparing.run(submit_all, target)
            break
        except Unloading:
            tickets.clear()
            if attempt or state.closing:
                raise ApiError(503, f"{served.name} is being unloaded; retry", headers={"Retry-After": "1"}) from None
            target = await served_model(state, {"model": served.name})
        except QueueFull as exc:
            raise ApiError(
                503, f"the server is busy: {explain(exc)}", code="queue_full", headers={"Retry-After": "1"}
            ) from None
        except LlmrunError as exc:
            raise request_error(exc, call) from None
        except BaseException:  # cancelled while the thread prepares: it cancels what it queues from now on
            abandoned.set()
            cancel(tickets)
            raise
    return queue, tickets


def cancel(tickets: list[Handle]) -> None:
    for ticket in tickets:
        ticket.cancel()


def request_error(exc: LlmrunError, call: api.Call) -> ApiError:
    """An error the engine gave a request: 503 while stopping, else the request's fault (400)
    unless it is the model's (500)."""
    prompt = "messages" if call.requests[0].messages else "prompt"
    if isinstance(exc, UnsupportedFormat):
        field = "tools" if call.requests[0].tools is not None else "response_format"
        return ApiError(400, explain(exc), param=field, code="invalid_request")
    if isinstance(exc, ShuttingDown):
        return ApiError(503, explain(exc), code="shutting_down")
    if isinstance(exc, TimedOut):
        return ApiError(503, explain(exc), code="request_timeout")
    if isinstance(exc, TemplateError):  # the model's template refuses these messages (roles out of order, …)
        return ApiError(400, explain(exc), param=prompt, code="invalid_request")
    if isinstance(exc, ContextFull):
        return ApiError(400, explain(exc), param=prompt, code="context_length_exceeded")
    if isinstance(exc, UsageError):
        return ApiError(400, explain(exc), param=prompt, code="invalid_request")
    return ApiError(500, explain(exc), code="engine_error")


DISCONNECT_CHECK_S = 0.5  # how often a non-streaming request looks whether its client is still there


async def gather(
    request: Request,
    queue: asyncio.Queue[tuple[int, Event]],
    tickets: list[Handle],
    call: api.Call,
    metrics: Metrics,
    started: float,
) -> list[Result]:
    """Every choice's Result; the tickets are cancelled when the client goes away first."""
    count = len(call.requests)
    results: dict[int, Result] = {}
    first = True
    checked = time.monotonic()
    try:
        while len(results) < count:
            if time.monotonic() - checked >= DISCONNECT_CHECK_S:  # tokens arriving do not hide a client gone
                checked = time.monotonic()
                if await request.is_disconnected():
                    raise ClientGone
            try:
                index, event = await asyncio.wait_for(queue.get(), timeout=DISCONNECT_CHECK_S)
            except TimeoutError:
                continue
            if first:
                metrics.time_to_first_token.observe(time.monotonic() - started)
                first = False
            if isinstance(event, LlmrunError):
                raise request_error(event, call)
            if isinstance(event, Result):
                results[index] = event
                tally(metrics, event, started)
    except BaseException:
        cancel(tickets)
        raise
    return [results[i] for i in range(count)]


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


def tally(metrics: Metrics, result: Result, started: float) -> None:
    if result.finish_reason == "time":
        metrics.timed_out.inc()
    metrics.prompt_tokens.inc(result.prompt_tokens)
    metrics.cached_prompt_tokens.inc(result.cached_tokens)
    metrics.generated_tokens.inc(result.generated_tokens)
    metrics.latency.observe(time.monotonic() - started)


def embed_inputs(embedding: Embedding, call: api.EmbeddingCall) -> tuple[Any, int]:
    """The vectors of every input and the tokens they took; an input the model cannot read whole is a 400."""
    embedder = embedding.embedder
    with embedding.lock:
        texts = []
        for i, item in enumerate(call.inputs):
            if isinstance(item, tuple):
                if not isinstance(embedder, ReadsTokens):
                    raise ApiError(400, f"{embedding.name} takes text, not token arrays", param=f"input[{i}]")
                bad = outside_vocabulary(item, embedder.vocab_size)
                if bad is not None:
                    message = (
                        f"input[{i}][{bad}] is token id {item[bad]}, which is not in {embedding.name}'s vocabulary "
                        f"(ids 0 to {embedder.vocab_size - 1})"
                    )
                    raise ApiError(400, message, param=f"input[{i}][{bad}]", code="invalid_token")
                item = embedder.detokenize(item)
            texts.append(item)
        counts = [embedder.count(text) for text in texts]
        for i, count in enumerate(counts):
            if count > embedder.max_tokens:
                message = f"input[{i}] is {count} tokens; {embedding.name} reads at most {embedder.max_tokens}"
                raise ApiError(400, message, param=f"input[{i}]", code="context_length_exceeded")
        return embedder.embed(texts), sum(counts)
