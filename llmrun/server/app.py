"""The HTTP server (FastAPI) over the engine's schedulers: the app, its guard (key, body size), the error
shapes, health, metrics and /openapi.json; the routes of each API are in :mod:`~llmrun.server.openai_routes`
and :mod:`~llmrun.server.ollama_routes`. Every error is in the API's own shape, and nothing a client sends
stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmrun import __version__
from llmrun.api.errors import ApiError
from llmrun.server import look_routes, ollama_routes, openai_routes, web
from llmrun.server.metrics import Metrics
from llmrun.server.state import ServerConfig, ServerState

log = logging.getLogger("llmrun.server")
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

    app.add_middleware(Guard, config=state.config, metrics=metrics)  # outermost: before CORS and the routes

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

        return describe(state.names(), state.limits(), __version__)

    openai_routes.add_routes(app, state, metrics)
    ollama_routes.add_routes(app, state, metrics)
    look_routes.add_routes(app, state)
    if state.config.ui:
        web.add_routes(app)

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
    look_routes.PATH,
    "/",
}
KNOWN |= {
    f"/api/{name}" for name in ("version", "tags", "ps", "show", "generate", "chat", "embed", "embeddings", "pull")
}


# --- request plumbing ------------------------------------------------------------------


class Guard:
    """Every request: the key and the body's size checked before anything runs, and counted by endpoint
    and status. A plain ASGI middleware, not Starlette's ``BaseHTTPMiddleware`` (``@app.middleware``):
    through that one a route never sees its client go away (``Request.is_disconnected`` stays False,
    starlette discussion 2094), so a request nobody waits for would keep its slot."""

    def __init__(self, app: ASGIApp, config: ServerConfig, metrics: Metrics) -> None:
        self.app = app
        self.config = config
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        endpoint = request.url.path
        status = 500  # unless a response starts

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            try:
                if not (self.config.ui and web.is_page_path(endpoint)):  # the page asks for the key itself
                    _authorize(request, self.config.api_key)
                _check_length(request, self.config.max_body_bytes)
            except ApiError as exc:
                await _error_response(exc, endpoint)(scope, receive, counted)
                return
            await self.app(scope, receive, counted)
        finally:
            self.metrics.requests.labels(endpoint if endpoint in KNOWN else "other", str(status)).inc()


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


def _error_response(exc: ApiError, path: str = "") -> JSONResponse:
    """The error in the API's own shape: OpenAI's, or Ollama's ``{"error": "…"}`` under /api/."""
    body = {"error": exc.message} if path.startswith("/api/") else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)
