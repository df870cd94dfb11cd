"""``POST /llmrun/look``: ``llmrun look`` for the page's "Inside the model" view.

The body names a served model and a conversation (``messages``, as in chat completions) or a
``prompt``; the answer is ``llmrun look --json``'s report of one forward pass over the prompt the
model reads for it (the chat template applied, as a chat completion would). The capture runs on an
instance of the model of its own (the weights are mapped, not copied): the served instance's context
stays with its scheduler. One look runs at a time: another asked for meanwhile is a 503 with
``Retry-After`` (never a thread waiting in line: the threads are every request's).
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from llmrun.api import openai as api
from llmrun.api.errors import ApiError, bad_field
from llmrun.engine.request import Request as EngineRequest
from llmrun.errors import LlmrunError
from llmrun.server import jobs
from llmrun.server.state import Served, ServerState

PATH = "/llmrun/look"
MAX_TOKENS = 512  # the lens over 512 positions of Gemma 3's 262k vocabulary is ~20 s on two cores
FIELDS = {"model", "messages", "prompt", "top"}
_one_at_a_time = threading.Lock()


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.post(PATH)
    async def look(request: Request) -> dict[str, Any]:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        asked, top = parse(body, state)
        served = await jobs.served_model(state, body)
        if not _one_at_a_time.acquire(blocking=False):
            raise ApiError(
                503, "a look is already running; retry in a moment", code="server_busy", headers={"Retry-After": "5"}
            )
        try:
            return await run_in_threadpool(report, served, asked, top)
        except LlmrunError as exc:
            raise ApiError(400, exc.message, code="invalid_request") from None
        finally:
            _one_at_a_time.release()


def parse(body: Any, state: ServerState) -> tuple[EngineRequest, int]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise bad_field(unknown[0], f"unrecognized request argument supplied: {unknown[0]}", "unknown_parameter")
    top = body.get("top", 5)
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 20:
        raise bad_field("top", "top must be an integer from 1 to 20")
    prompt = body.get("prompt")
    if (prompt is None) == (body.get("messages") is None):
        raise bad_field("messages", "give messages (a conversation) or prompt, not both", "missing_required")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt:
            raise bad_field("prompt", "prompt must be a non-empty string", "invalid_type")
        return EngineRequest(prompt=prompt), top
    asked = EngineRequest(messages=api.parse_messages(body["messages"], state.limits()))
    if asked.has_images:
        raise bad_field(
            "messages", "the forward-pass views read text: send the conversation without its images", "invalid_image"
        )
    return asked, top


def report(served: Served, asked: EngineRequest, top: int) -> dict[str, Any]:
    from llmrun import backends
    from llmrun.engine.request import request_ids
    from llmrun.look.report import to_json
    from llmrun.look.view import look, piece_text

    if served.remote:
        raise ApiError(400, f"{served.name} runs on a remote engine: its forward pass cannot be looked into here")
    entry = served.scheduler.entry
    plan = entry.plan
    model = backends.get(plan.backend).load(plan.model.path, plan.load)
    try:
        ids = request_ids(model, entry.templates, asked).ids
        if len(ids) > MAX_TOKENS:
            raise ApiError(
                400,
                f"the prompt is {len(ids)} tokens; the page looks inside prompts of up to {MAX_TOKENS} "
                "(llmrun look takes longer ones)",
                code="prompt_too_long",
            )
        return to_json(look(model, served.name, ids, top=top), partial(piece_text, model))
    finally:
        model.close()
