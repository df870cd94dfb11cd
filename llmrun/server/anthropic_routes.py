"""Anthropic's Messages API on the same server (``POST /v1/messages``, ``/v1/messages/count_tokens``): what
Claude Code and the ``anthropic`` SDK call, on the same models and schedulers as the other routes. Bodies
are parsed by :mod:`llmrun.api.anthropic` (pure); streams are Anthropic's server-sent events
(:mod:`llmrun.api.anthropic_stream`); errors are Anthropic's ``{"type": "error", "error": {…}}``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from llmrun.api import anthropic
from llmrun.api import openai as api
from llmrun.api.anthropic_stream import EventStream
from llmrun.api.errors import ApiError
from llmrun.engine.request import tool_dialect
from llmrun.engine.result import Result
from llmrun.engine.scheduler import Event
from llmrun.errors import LlmrunError
from llmrun.remote.proxy import RemoteProxy
from llmrun.server import jobs
from llmrun.server.metrics import Metrics
from llmrun.server.state import ServerState

PATHS = ("/v1/messages", "/v1/messages/count_tokens")
SKIPPED_HEADER = "llmrun-skipped-tools"  # the server tools left out of the prompt (they run at Anthropic)


def add_routes(app: FastAPI, state: ServerState, metrics: Metrics) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        started = time.monotonic()
        body = await jobs.json_body(request, state.config.max_body_bytes)
        served = await jobs.served_model(state, body)
        call = anthropic.parse_messages(body, served.defaults, state.limits(served))
        engine_call = api.Call(call.model, (call.request,), call.stream, False, None)
        queue, tickets = await jobs.submit(state, served, engine_call)
        ident = anthropic.new_id()
        skipped = {SKIPPED_HEADER: ", ".join(call.skipped_tools)} if call.skipped_tools else {}
        if call.stream:
            from sse_starlette import EventSourceResponse

            dialect = tool_dialect(served.scheduler.entry.templates, call.request) if not served.remote else None
            stream = EventStream(call, ident, served.name, dialect, _prompt_tokens(tickets))
            events = _events(queue, tickets, engine_call, stream, metrics, started)
            return EventSourceResponse(
                events, ping=15, headers={"Cache-Control": "no-cache", **skipped}, shutdown_grace_period=2.0
            )
        try:
            [result] = await jobs.gather(request, queue, tickets, engine_call, metrics, started)
        except jobs.ClientGone:
            return Response(status_code=499)
        return JSONResponse(anthropic.message_body(result, ident, served.name, call.stop_sequences), headers=skipped)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict[str, Any]:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        served = await jobs.served_model(state, body)
        asked = anthropic.parse_count(body)
        if served.remote:
            raise ApiError(400, f"{served.name} runs on a remote engine: its tokens are counted there", param="model")
        try:
            assert not isinstance(served.scheduler, RemoteProxy)
            return {"input_tokens": await state.preparing.run(served.scheduler.measure, asked)}
        except LlmrunError as exc:
            raise jobs.request_error(exc, api.Call(served.name, (asked,), False, False, None)) from None


def _prompt_tokens(tickets: list[jobs.Handle]) -> int:
    prepared = getattr(tickets[0], "prepared", None) if tickets else None
    return len(prepared.ids) if prepared is not None else 0


async def _events(
    queue: asyncio.Queue[tuple[int, Event]],
    tickets: list[jobs.Handle],
    call: api.Call,
    stream: EventStream,
    metrics: Metrics,
    started: float,
) -> AsyncIterator[dict[str, str]]:
    """The answer's events as server-sent events; an error mid-stream is Anthropic's ``error`` event."""
    first = True
    try:
        for name, data in stream.start():
            yield {"event": name, "data": json.dumps(data)}
        while True:
            _, event = await queue.get()
            if first:
                metrics.time_to_first_token.observe(time.monotonic() - started)
                first = False
            if isinstance(event, LlmrunError):
                error = jobs.request_error(event, call)
                yield {"event": "error", "data": json.dumps(anthropic.error_body(error.status, error.message))}
                return
            if isinstance(event, Result):
                jobs.tally(metrics, event, started)
                for name, data in stream.result(event):
                    yield {"event": name, "data": json.dumps(data, ensure_ascii=False)}
                return
            for name, data in stream.token(event):
                yield {"event": name, "data": json.dumps(data, ensure_ascii=False)}
    finally:
        jobs.cancel(tickets)
