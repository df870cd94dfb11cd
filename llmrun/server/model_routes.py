"""Loading and unloading models over HTTP (``POST /llmrun/models/load``, ``/llmrun/models/unload``), behind the
server's key like every route: what ``llmrun stop`` and an operator's scripts call besides Ollama's forms.
Errors are OpenAI's shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from llmrun.api.errors import ApiError
from llmrun.api.openai import keep_alive
from llmrun.server import jobs
from llmrun.server.state import ServerState

PATHS = ("/llmrun/models/load", "/llmrun/models/unload")


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/llmrun/models/load")
    async def load(request: Request) -> dict[str, Any]:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        _check(body, {"model", "keep_alive"})
        served = await jobs.served_model(state, body)
        state.keep(served, keep_alive(body))
        return {"model": served.name, "loaded": True, "size": served.memory, "context_length": served.n_ctx}

    @app.post("/llmrun/models/unload")
    async def unload(request: Request) -> dict[str, Any]:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        _check(body, {"model"})
        name = state.untagged(body["model"])
        if not await state.loading.run(state.unload, name):
            raise ApiError(404, f"model {name!r} is not loaded", param="model", code="model_not_loaded")
        return {"model": name, "unloaded": True}


def _check(body: Any, fields: set[str]) -> None:
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"].strip():
        raise ApiError(400, 'the body is {"model": "NAME"}', param="model")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise ApiError(400, f"unrecognized field: {unknown[0]}", param=unknown[0], code="unknown_parameter")
