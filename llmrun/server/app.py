"""The HTTP server (FastAPI) over the engine's schedulers: the app, its guard (key, body size), the error
shapes, health, metrics and /openapi.json; the routes of each API are in :mod:`~llmrun.server.openai_routes`
and :mod:`~llmrun.server.ollama_routes`. Every error is in the API's own shape, and nothing a client sends
stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmrun import __version__
from llmrun.api.errors import ApiError
from llmrun.server import (
    anthropic_routes,
    look_routes,
    model_routes,
    ollama_routes,
    openai_routes,
    responses_routes,
    web,
)
from llmrun.server.errors import error_response
from llmrun.server.guard import Guard, Policy
from llmrun.server.metrics import Metrics
from llmrun.server.state import ServerState

log = logging.getLogger("llmrun.server")


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

    config = state.config
    policy = Policy(config.api_key, config.allowed_hosts, config.cors_origins, config.max_body_bytes, config.ui)
    app.add_middleware(Guard, policy=policy, metrics=metrics, known=KNOWN)  # outermost: before CORS and the routes

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def no_route(request: Request, exc: StarletteHTTPException) -> Response:
        """No such route (404) or method (405), answered in the API's own error shape."""
        message = "no such endpoint" if exc.status_code == 404 else str(exc.detail).lower()
        code = "not_found" if exc.status_code == 404 else "method_not_allowed"
        where = f"{message}: {request.method} {request.url.path}"
        error = ApiError(exc.status_code, where, code=code, headers=dict(exc.headers or {}))  # 405 keeps Allow
        return error_response(error, request.url.path)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error")
        error = ApiError(500, "internal server error (the server log has the details)")
        return error_response(error, request.url.path)

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
    anthropic_routes.add_routes(app, state, metrics)
    responses_routes.add_routes(app, state, metrics)
    model_routes.add_routes(app, state)
    ollama_routes.add_routes(app, state, metrics)
    look_routes.add_routes(app, state)
    if state.config.ui:
        web.add_routes(app)

    return app


async def _expire_idle(state: ServerState, every: float = 1.0) -> None:
    """Unload models past their keep-alive (the server's, or the latest request's), every second."""
    while True:
        await asyncio.sleep(every)
        for name in await run_in_threadpool(state.expire):
            log.info("unloaded %s (idle past --keep-alive)", name)


KNOWN = frozenset(
    {
        "/health",
        "/metrics",
        "/openapi.json",
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        look_routes.PATH,
        *anthropic_routes.PATHS,
        *responses_routes.PATHS,
        *model_routes.PATHS,
        "/",
        *(
            f"/api/{name}"
            for name in ("version", "tags", "ps", "show", "generate", "chat", "embed", "embeddings", "pull")
        ),
    }
)
