"""OpenAI's routes (``/v1``): models, chat completions, completions, embeddings.

Bodies are read with a size limit, parsed by :mod:`llmrun.api.openai` (pure), and submitted to the
model's :class:`~llmrun.engine.scheduler.Scheduler`; its events reach the request's coroutine through
an asyncio queue. A streaming request sends OpenAI's server-sent events (chunks from
:class:`~llmrun.api.openai_stream.ChunkStream`); a client that goes away cancels its requests, which
frees their slots before the next decode step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from llmrun import __version__
from llmrun.api import openai as api
from llmrun.api.errors import ApiError
from llmrun.api.openai_stream import ChunkStream
from llmrun.engine.request import tool_dialect
from llmrun.engine.result import Result
from llmrun.engine.scheduler import Event
from llmrun.errors import LlmrunError
from llmrun.server import jobs
from llmrun.server.metrics import Metrics
from llmrun.server.state import Served, ServerState

FINGERPRINT = f"llmrun-{__version__}"


def add_routes(app: FastAPI, state: ServerState, metrics: Metrics) -> None:
    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(state, name) for name in state.names()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        if name not in state.names():
            raise ApiError(404, f"model {name!r} is not served here", param="model", code="model_not_found")
        return _model_card(state, name)

    async def text(request: Request, *, chat: bool) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        served = await jobs.served_model(state, body)
        parse = api.parse_chat if chat else api.parse_completion
        if chat and state.config.image_urls is not None:
            from llmrun.server.image_urls import fetch_images, with_placeholders

            parse(with_placeholders(body), served.defaults, state.limits(served))  # the whole body checked first
            body = await fetch_images(body, state.config.image_urls, served.name, jobs.sees_images(served))
        call = parse(body, served.defaults, state.limits(served))
        state.keep(served, call.keep_alive)
        return await _complete(request, state, served, call, metrics, chat=chat)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await text(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await text(request, chat=False)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        call = api.parse_embeddings(body)
        jobs.wrong_kind(state, call.model, embedding=True)
        embedding = await jobs.embedding_model(state, call.model)
        if call.dimensions is not None and call.dimensions != embedding.embedder.dimension:
            message = f"{embedding.name} makes {embedding.embedder.dimension}-dimension vectors; it cannot make others"
            raise ApiError(400, message, param="dimensions", code="unsupported_value")
        vectors, tokens = await state.embedding.run(jobs.embed_inputs, embedding, call)
        return JSONResponse(
            {
                "object": "list",
                "data": [api.embedding_item(i, v, call.base64) for i, v in enumerate(vectors)],
                "model": embedding.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    """OpenAI's model object, and llmrun's word on it: whether it is loaded, its memory and until when."""
    served = state.find(name)
    loaded: dict[str, Any] = {"loaded": served is not None}
    if served is not None:
        expires = state.expires_in(served)
        loaded |= {"size": served.memory, "expires_in_s": None if expires is None else round(expires, 1)}
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmrun", "llmrun": loaded}


async def _complete(
    request: Request, state: ServerState, served: Served, call: api.Call, metrics: Metrics, *, chat: bool
) -> Response:
    started = time.monotonic()
    queue, tickets = await jobs.submit(state, served, call)
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    head = {"id": ident, "created": int(time.time()), "model": served.name, "system_fingerprint": FINGERPRINT}
    if call.stream:
        from sse_starlette import EventSourceResponse

        dialect = (
            tool_dialect(served.scheduler.entry.templates, call.requests[0]) if chat and not served.remote else None
        )
        chunks = ChunkStream(call, head, chat=chat, dialect=dialect)
        events = _stream(queue, tickets, call, chunks, metrics, started)
        # on shutdown the schedulers stop first and send each stream an error event; the grace
        # period lets it reach the client before sse-starlette ends the response
        return EventSourceResponse(events, ping=15, headers={"Cache-Control": "no-cache"}, shutdown_grace_period=2.0)
    try:
        results = await jobs.gather(request, queue, tickets, call, metrics, started)
    except jobs.ClientGone:
        return Response(status_code=499)  # nobody reads it: the client closed the connection
    choices = [(api.chat_choice if chat else api.completion_choice)(i, r, call.logprobs) for i, r in enumerate(results)]
    body = {
        **head,
        "object": "chat.completion" if chat else "text_completion",
        "choices": choices,
        "usage": api.usage(results, call.n),
    }
    return JSONResponse(body)


async def _stream(
    queue: asyncio.Queue[tuple[int, Event]],
    tickets: list[jobs.Handle],
    call: api.Call,
    chunks: ChunkStream,
    metrics: Metrics,
    started: float,
) -> AsyncIterator[str]:
    """The call's events as server-sent events, then [DONE]; an error mid-stream is an error object, and
    the stream ends. Its requests are cancelled when the stream ends early (the client went away)."""
    first = True
    try:
        for chunk in chunks.start():
            yield json.dumps(chunk, ensure_ascii=False)
        while chunks.remaining:
            index, event = await queue.get()
            if first:
                metrics.time_to_first_token.observe(time.monotonic() - started)
                first = False
            if isinstance(event, LlmrunError):
                yield json.dumps(jobs.request_error(event, call).body())
                return
            if isinstance(event, Result):
                jobs.tally(metrics, event, started)
                out = chunks.result(index, event)
            else:
                out = chunks.token(index, event)
            for chunk in out:
                yield json.dumps(chunk, ensure_ascii=False)
        for chunk in chunks.end():
            yield json.dumps(chunk, ensure_ascii=False)
        yield "[DONE]"
    finally:
        jobs.cancel(tickets)
