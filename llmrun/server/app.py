"""The OpenAI-compatible HTTP API (FastAPI) over the engine's schedulers.

Bodies are read with a size limit, parsed by :mod:`llmrun.api.openai` (pure),
and submitted to the model's :class:`~llmrun.engine.scheduler.Scheduler`; its events
reach the request's coroutine through an asyncio queue. A streaming request sends
OpenAI's server-sent events; a client that goes away cancels its requests, which
frees their slots before the next decode step. Every error is OpenAI's error shape,
and nothing a client sends stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmrun import __version__
from llmrun.api import openai as api
from llmrun.api.errors import ApiError
from llmrun.api.openai_tools import tool_call_deltas
from llmrun.engine.request import tool_dialect
from llmrun.engine.result import Result
from llmrun.engine.scheduler import Event, Ticket
from llmrun.errors import LlmrunError
from llmrun.server import jobs, ollama_routes
from llmrun.server.metrics import Metrics
from llmrun.server.state import Served, ServerState
from llmrun.structured.tools import Dialect, TextStream

log = logging.getLogger("llmrun.server")
FINGERPRINT = f"llmrun-{__version__}"
OPEN_PATHS = ("/health",)  # answered without a key (load balancers, probes)


def create_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        expiry = asyncio.create_task(_expire_idle(state))
        try:
            yield
        finally:
            expiry.cancel()

    app = FastAPI(
        title="llmrun", version=__version__, docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.llmrun = state
    metrics = Metrics()
    app.state.metrics = metrics

    if state.config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(state.config.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        endpoint = request.url.path
        try:
            _authorize(request, state.config.api_key)
            _check_length(request, state.config.max_body_bytes)
            response = await call_next(request)
        except ApiError as exc:
            response = _error_response(exc, endpoint)
        metrics.requests.labels(endpoint if endpoint in KNOWN else "other", str(response.status_code)).inc()
        return response

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return _error_response(exc, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def no_route(request: Request, exc: StarletteHTTPException) -> Response:
        """No such route (404) or method (405), answered in the API's own error shape."""
        message = "no such endpoint" if exc.status_code == 404 else str(exc.detail).lower()
        code = "not_found" if exc.status_code == 404 else "method_not_allowed"
        where = f"{message}: {request.method} {request.url.path}"
        error = ApiError(exc.status_code, where, code=code, headers=dict(exc.headers or {}))  # 405 keeps Allow
        return _error_response(error, request.url.path)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error")
        error = ApiError(500, "internal server error (the server log has the details)")
        return _error_response(error, request.url.path)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, and what a load balancer routes by: slots (sequences decoded at once) and the queue."""
        load = state.load()
        return {
            "status": "ok",
            "models": [s.name for s in state.served()],
            "slots": {"total": load.slots, "busy": load.busy, "idle": max(0, load.slots - load.busy)},
            "queue": load.queued,
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        load = state.load()
        metrics.queue_depth.set(load.queued)
        metrics.busy_slots.set(load.busy)
        metrics.slots.set(load.slots)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json")
    async def openapi() -> dict[str, Any]:
        from llmrun.server.openapi import describe

        served = state.served()
        longest = min((s.n_ctx for s in served), default=1)
        return describe(state.names(), api.Limits(max_tokens=longest, max_n=state.config.max_n), __version__)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(name) for name in state.names()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        if name not in state.names():
            raise ApiError(404, f"model {name!r} is not served here", param="model", code="model_not_found")
        return _model_card(name)

    async def text(request: Request, *, chat: bool) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        served = await jobs.served_model(state, body)
        parse = api.parse_chat if chat else api.parse_completion
        call = parse(body, served.defaults, api.Limits(max_tokens=served.n_ctx, max_n=state.config.max_n))
        return await _complete(request, served, call, metrics, chat=chat)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await text(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await text(request, chat=False)

    ollama_routes.add_routes(app, state, metrics)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        call = api.parse_embeddings(body)
        jobs.wrong_kind(state, call.model, embedding=True)
        try:
            embedding = await run_in_threadpool(state.get_embedding, call.model)
        except LlmrunError as exc:
            raise jobs.model_error(state, call.model, exc) from None
        if call.dimensions is not None and call.dimensions != embedding.embedder.dimension:
            message = f"{embedding.name} makes {embedding.embedder.dimension}-dimension vectors; it cannot make others"
            raise ApiError(400, message, param="dimensions", code="unsupported_value")
        vectors, tokens = await run_in_threadpool(jobs.embed_inputs, embedding, call)
        return JSONResponse(
            {
                "object": "list",
                "data": [api.embedding_item(i, v, call.base64) for i, v in enumerate(vectors)],
                "model": embedding.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    return app


async def _expire_idle(state: ServerState, every: float = 5.0) -> None:
    """Unload models past their keep-alive, every few seconds."""
    while True:
        await asyncio.sleep(every)
        for name in await run_in_threadpool(state.expire):
            log.info("unloaded %s (idle past --keep-alive)", name)


KNOWN = {
    "/health",
    "/metrics",
    "/openapi.json",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
}
KNOWN |= {
    f"/api/{name}" for name in ("version", "tags", "ps", "show", "generate", "chat", "embed", "embeddings", "pull")
}


# --- request plumbing ------------------------------------------------------------------


def _authorize(request: Request, key: str | None) -> None:
    if key is None or request.url.path in OPEN_PATHS or request.method == "OPTIONS":
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise ApiError(401, "missing API key: send Authorization: Bearer KEY", code="missing_api_key")
    if not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise ApiError(401, "incorrect API key", code="invalid_api_key")


def _check_length(request: Request, limit: int) -> None:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body is over {limit} bytes", code="request_too_large")


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmrun"}


def _error_response(exc: ApiError, path: str = "") -> JSONResponse:
    """The error in the API's own shape: OpenAI's, or Ollama's ``{"error": "…"}`` under /api/."""
    body = {"error": exc.message} if path.startswith("/api/") else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


async def _complete(request: Request, served: Served, call: api.Call, metrics: Metrics, *, chat: bool) -> Response:
    started = time.monotonic()
    queue, tickets = jobs.submit(served, call)
    ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    head = {"id": ident, "created": int(time.time()), "model": served.name, "system_fingerprint": FINGERPRINT}
    if call.stream:
        from sse_starlette import EventSourceResponse

        dialect = tool_dialect(served.scheduler.entry.templates, call.requests[0]) if chat else None
        events = _stream(queue, tickets, call, head, metrics, started, chat=chat, dialect=dialect)
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


UNFINISHED = {"finish_reason": None}


async def _stream(
    queue: asyncio.Queue[tuple[int, Event]],
    tickets: list[Ticket],
    call: api.Call,
    head: dict[str, Any],
    metrics: Metrics,
    started: float,
    *,
    chat: bool,
    dialect: Dialect | None = None,
) -> AsyncIterator[str]:
    """OpenAI's chunks: the role first (chat), then text deltas, each choice's finish_reason, the usage
    chunk when asked, then [DONE]; an error mid-stream is an error object, and the stream ends."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    remaining = len(call.requests)
    texts = [TextStream(dialect) for _ in call.requests] if dialect is not None else None
    results: dict[int, Result] = {}
    first = True

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return json.dumps({**head, "object": kind, "choices": choices, **extra}, ensure_ascii=False)

    def choice(
        index: int, text: str | None, finish: str | None, logprobs: Any = None, role: bool = False
    ) -> dict[str, Any]:
        if not chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        delta: dict[str, Any] = {}
        if role:
            delta = {"role": "assistant", "content": ""}
        elif text is not None:
            delta = {"content": text}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    try:
        if chat:
            yield chunk([choice(i, None, None, role=True) for i in range(remaining)])
        while remaining:
            index, event = await queue.get()
            if first:
                metrics.time_to_first_token.observe(time.monotonic() - started)
                first = False
            if isinstance(event, LlmrunError):
                yield json.dumps(jobs.request_error(event, call).body())
                return
            if isinstance(event, Result):
                remaining -= 1
                results[index] = event
                jobs.tally(metrics, event, started)
                if texts is not None:  # the calls, read from the whole answer; any text not yet shown
                    for delta in tool_call_deltas(event.tool_calls):
                        yield chunk([{"index": index, "delta": {"tool_calls": delta}, "logprobs": None, **UNFINISHED}])
                    shown, content = texts[index].shown, event.content or ""
                    if not event.tool_calls and content.startswith(shown) and content != shown:
                        yield chunk([choice(index, content[len(shown) :], None)])
                yield chunk([choice(index, None if chat else "", api.finish_reason(event))])
                continue
            if event.reasoning and chat:
                thought = {"reasoning_content": event.reasoning}
                yield chunk([{"index": index, "delta": thought, "logprobs": None, **UNFINISHED}])
            if texts is not None:  # with tools: text once the answer shows it is not a call
                shown = texts[index].feed(event.text)
                if shown:
                    yield chunk([choice(index, shown, None)])
                continue
            if event.text:
                yield chunk([choice(index, event.text, None, _token_logprobs(event, call.logprobs, chat))])
        if call.include_usage:
            yield chunk([], usage=api.usage([results[i] for i in sorted(results)], call.n))
        yield "[DONE]"
    finally:
        jobs.cancel(tickets)


def _token_logprobs(token: Any, alternatives: int | None, chat: bool) -> Any:
    if alternatives is None or token.logprob is None:
        return None
    if chat:

        def one(piece: bytes, logprob: float) -> dict[str, Any]:
            return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}

        entry = {
            **one(token.text.encode(), token.logprob),
            "top_logprobs": [one(c.piece, c.logprob) for c in token.top[:alternatives]],
        }
        return {"content": [entry], "refusal": None}
    return {
        "tokens": [token.text],
        "token_logprobs": [token.logprob],
        "top_logprobs": [{c.piece.decode("utf-8", "replace"): c.logprob for c in token.top[:alternatives]}],
        "text_offset": [0],
    }
