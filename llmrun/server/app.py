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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmrun import __version__
from llmrun.api import openai as api
from llmrun.api.errors import ApiError
from llmrun.server import ollama_routes, openai_routes
from llmrun.server.metrics import Metrics
from llmrun.server.state import ServerState

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

    openai_routes.add_routes(app, state, metrics)
    ollama_routes.add_routes(app, state, metrics)

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


def _error_response(exc: ApiError, path: str = "") -> JSONResponse:
    """The error in the API's own shape: OpenAI's, or Ollama's ``{"error": "…"}`` under /api/."""
    body = {"error": exc.message} if path.startswith("/api/") else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)
