"""OpenAI's Responses API on the same server (``/v1/responses``): what Codex CLI and the ``openai`` SDK's
``responses`` call, on the same models and schedulers as the other routes. Bodies are parsed by
:mod:`llmrun.api.responses` (pure); streams are its server-sent events (:mod:`llmrun.api.responses_stream`);
stored responses live in a bounded :class:`~llmrun.server.responses_store.ResponseStore`, read and written
off the event loop. Errors are OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from llmrun.api import openai as api
from llmrun.api import responses
from llmrun.api.errors import ApiError
from llmrun.api.responses_input import new_id
from llmrun.api.responses_stream import EventStream
from llmrun.engine.request import tool_dialect
from llmrun.engine.result import Result
from llmrun.engine.scheduler import Event
from llmrun.errors import LlmrunError
from llmrun.paths import home_dir
from llmrun.remote.proxy import RemoteProxy
from llmrun.server import jobs
from llmrun.server.metrics import Metrics
from llmrun.server.responses_store import ResponseStore
from llmrun.server.state import ServerState

PATHS = ("/v1/responses", "/v1/responses/input_tokens")
SKIPPED_HEADER = "llmrun-skipped-tools"
log = logging.getLogger("llmrun.server")


def add_routes(app: FastAPI, state: ServerState, metrics: Metrics, store: ResponseStore | None = None) -> None:
    kept = store or ResponseStore(home_dir() / "responses")

    async def earlier(body: Any) -> tuple[dict[str, Any], ...]:
        """The conversation of the response a request continues (``previous_response_id``)."""
        ident = body.get("previous_response_id") if isinstance(body, dict) else None
        if ident is None:
            return ()
        if not isinstance(ident, str):
            raise ApiError(400, "previous_response_id must be a string", param="previous_response_id")
        record = await asyncio.to_thread(kept.load, ident)
        if record is None:
            message = f"Previous response with id {ident!r} not found (responses are kept only with store: true)"
            raise ApiError(400, message, param="previous_response_id", code="previous_response_not_found")
        return tuple(record["conversation"])

    @app.post("/v1/responses")
    async def create(request: Request) -> Response:
        started, created = time.monotonic(), time.time()
        body = await jobs.json_body(request, state.config.max_body_bytes)
        served = await jobs.served_model(state, body)
        before = await earlier(body)
        call = responses.parse_create(body, served.defaults, state.limits(served), before, jobs.sees_images(served))
        state.keep(served, call.keep_alive)
        engine_call = api.Call(call.model, (call.request,), call.stream, False, None)
        try:
            queue, tickets = await jobs.submit(state, served, engine_call)
        except ApiError as exc:
            raise _in_words(exc) from None
        ident = new_id("resp_")
        headers = {SKIPPED_HEADER: ", ".join(call.skipped_tools)} if call.skipped_tools else {}
        if call.skipped_tools:
            log.info("%s: hosted tools left out (they run at OpenAI): %s", ident, ", ".join(call.skipped_tools))

        async def keep(body: dict[str, Any]) -> None:
            if call.store:
                await asyncio.to_thread(kept.save, ident, responses.stored(body, call, before))

        if call.stream:
            from sse_starlette import EventSourceResponse

            dialect = tool_dialect(served.scheduler.entry.templates, call.request) if not served.remote else None
            stream = EventStream(call, ident, served.name, created, dialect)
            events = _events(queue, tickets, engine_call, stream, metrics, started, keep)
            headers = {"Cache-Control": "no-cache", **headers}
            return EventSourceResponse(events, ping=15, headers=headers, shutdown_grace_period=2.0)
        try:
            [result] = await jobs.gather(request, queue, tickets, engine_call, metrics, started)
        except jobs.ClientGone:
            return Response(status_code=499)
        except ApiError as exc:
            raise _in_words(exc) from None
        output = responses.output_items(result, responses.OutputIds(), call.names)
        answer = responses.response_body(ident, served.name, call, created, result, output)
        await keep(answer)
        return JSONResponse(answer, headers=headers)

    @app.post("/v1/responses/input_tokens")
    async def input_tokens(request: Request) -> dict[str, Any]:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        served = await jobs.served_model(state, body)
        asked = responses.parse_count(body, await earlier(body))
        if served.remote or isinstance(served.scheduler, RemoteProxy):
            raise ApiError(400, f"{served.name} runs on a remote engine: its tokens are counted there", param="model")
        try:
            count = await state.preparing.run(served.scheduler.measure, asked)
        except LlmrunError as exc:
            raise _in_words(jobs.request_error(exc, api.Call(served.name, (asked,), False, False, None))) from None
        return {"object": "response.input_tokens", "input_tokens": count}

    async def found(ident: str) -> dict[str, Any]:
        record = await asyncio.to_thread(kept.load, ident)
        if record is None:
            raise ApiError(404, f"No response found with id {ident!r}.", param="response_id", code="not_found")
        return record

    @app.api_route("/v1/responses/{ident}", methods=["GET", "DELETE"])  # one route: a 405 names both methods
    async def stored(ident: str, request: Request) -> dict[str, Any]:
        if request.method == "DELETE":
            if not await asyncio.to_thread(kept.delete, ident):
                raise ApiError(404, f"No response found with id {ident!r}.", param="response_id", code="not_found")
            return {"id": ident, "object": "response.deleted", "deleted": True}
        response: dict[str, Any] = (await found(ident))["response"]
        return response

    @app.get("/v1/responses/{ident}/input_items")
    async def input_items(ident: str, request: Request) -> dict[str, Any]:
        items = list((await found(ident))["input_items"])
        return _page(items, dict(request.query_params))

    @app.post("/v1/responses/{ident}/cancel")
    async def cancel(ident: str) -> dict[str, Any]:
        await found(ident)
        raise ApiError(400, "Only background responses can be cancelled; this server makes none", param="response_id")


def _page(items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """A page of a response's input items, as OpenAI lists them (``order`` desc by default, ``after``, ``limit``)."""
    order, after, limit = query.get("order", "desc"), query.get("after"), query.get("limit", "20")
    if order not in ("asc", "desc"):
        raise ApiError(400, "order must be asc or desc", param="order")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise ApiError(400, "limit must be an integer in [1, 100]", param="limit")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise ApiError(400, f"after: no input item {after!r} in this response", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    page = ordered[: int(limit)]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > len(page),
    }


def _in_words(error: ApiError) -> ApiError:
    """An engine error named in this API's words: the conversation is ``input``."""
    if error.param == "messages":
        error.param = "input"
    return error


async def _events(
    queue: asyncio.Queue[tuple[int, Event]],
    tickets: list[jobs.Handle],
    call: api.Call,
    stream: EventStream,
    metrics: Metrics,
    started: float,
    keep: Any,
) -> AsyncIterator[dict[str, str]]:
    """The answer's events as server-sent events; an error mid-stream is an ``error`` event and
    ``response.failed``. A completed response is stored before its last event is sent."""
    first = True
    try:
        for name, data in stream.start():
            yield {"event": name, "data": json.dumps(data, ensure_ascii=False)}
        while True:
            _, event = await queue.get()
            if first:
                metrics.time_to_first_token.observe(time.monotonic() - started)
                first = False
            if isinstance(event, LlmrunError):
                error = _in_words(jobs.request_error(event, call))
                shaped = {"code": error.code, "message": error.message, "param": error.param}
                for name, data in stream.failed(shaped):
                    yield {"event": name, "data": json.dumps(data, ensure_ascii=False)}
                return
            if isinstance(event, Result):
                jobs.tally(metrics, event, started)
                out = stream.result(event)
                await keep(out[-1][1]["response"])
                for name, data in out:
                    yield {"event": name, "data": json.dumps(data, ensure_ascii=False)}
                return
            for name, data in stream.token(event):
                yield {"event": name, "data": json.dumps(data, ensure_ascii=False)}
    finally:
        jobs.cancel(tickets)
