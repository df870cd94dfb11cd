"""Ollama's API on the same server: what the ``ollama`` libraries, Open WebUI, Continue and LangChain's
ChatOllama call (``/api/version``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/generate``,
``/api/chat``, ``/api/embed``, ``/api/embeddings``), on the same engine, schedulers and models as the
OpenAI routes. Streams are NDJSON; errors are ``{"error": "…"}`` with Ollama's statuses."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from llmrun.engine import Result
from llmrun.engine.request import tool_dialect
from llmrun.errors import LlmrunError, ModelNotFound
from llmrun.server import jobs
from llmrun.server import ollama_api as ollama
from llmrun.server import openai_api as api
from llmrun.server.errors import ApiError, explain
from llmrun.server.metrics import Metrics
from llmrun.server.state import Served, ServerState, in_ollama
from llmrun.structured.tools import TextStream

Handler = Callable[[Request], Awaitable[Response]]
log = logging.getLogger("llmrun.server")


def add_routes(app: FastAPI, state: ServerState, metrics: Metrics) -> None:
    def ollama_errors(handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except ollama.OllamaError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            except ApiError as exc:  # the shared plumbing's errors, in Ollama's shape
                return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

        return wrapped

    @app.get("/api/version")
    async def version() -> dict[str, Any]:
        return {"version": ollama.VERSION}

    @app.get("/api/tags")
    async def tags() -> dict[str, Any]:
        """What this server runs, and what Ollama's store holds (served from there when asked for)."""
        from llmrun.otherstores import ollama_models

        names = state.names()
        cards = [_card(state, name) for name in names]
        for listed in ollama_models():
            name = listed.name.removeprefix("ollama:")
            if listed.path is not None and name not in names:
                cards.append({**_card(state, name), "size": listed.size, "details": {**NO_DETAILS}})
        return {"models": cards}

    @app.get("/api/ps")
    async def ps() -> dict[str, Any]:
        loaded = [s.name for s in state.served()] + [e.name for e in state.embeddings()]
        return {"models": [{**_card(state, name), "expires_at": _expires(state), "size_vram": 0} for name in loaded]}

    @app.post("/api/show")
    @ollama_errors
    async def show(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
        if not isinstance(name, str) or (name not in state.names() and not in_ollama(name)):
            raise ollama.OllamaError(404, f"model {name!r} not found")
        served = await jobs.served_model(state, {"model": name}) if not _embedding(state, name) else None
        return JSONResponse(_show(state, name, served))

    @app.post("/api/generate")
    @ollama_errors
    async def generate(request: Request) -> Response:
        started = time.monotonic()
        body = await jobs.json_body(request, state.config.max_body_bytes)
        served = await _served(state, body)
        call = ollama.parse_generate(body, served.defaults)
        if call.request.prompt == "":  # Ollama: an empty prompt loads the model and answers at once
            return JSONResponse({**_head(served), "response": "", "done": True, "done_reason": "load"})
        return await _answer(request, served, call, metrics, started, chat=False)

    @app.post("/api/chat")
    @ollama_errors
    async def chat(request: Request) -> Response:
        started = time.monotonic()
        body = await jobs.json_body(request, state.config.max_body_bytes)
        served = await _served(state, body)
        call = ollama.parse_chat(body, served.defaults)
        return await _answer(request, served, call, metrics, started, chat=True)

    @app.post("/api/pull")
    @ollama_errors
    async def pull(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise ollama.OllamaError(400, "model is required")
        if not state.config.allow_pull:
            raise ollama.OllamaError(403, "pulling is off on this server: its operator can start it with --allow-pull")
        stream = body.get("stream", True)
        statuses = _pulled(state, name.strip())
        if stream is not False:
            return StreamingResponse(statuses, media_type="application/x-ndjson")
        last: dict[str, Any] = {}
        async for line in statuses:
            last = json.loads(line)
        return JSONResponse(last, status_code=200 if "error" not in last else 500)

    @app.post("/api/embed")
    @ollama_errors
    async def embed(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        if not isinstance(body, dict):
            raise ollama.OllamaError(400, "the request body must be a JSON object")
        raw = body.get("input")
        return await _embed(state, body, raw if isinstance(raw, list) else [raw], legacy=False)

    @app.post("/api/embeddings")
    @ollama_errors
    async def embeddings(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        if not isinstance(body, dict):
            raise ollama.OllamaError(400, "the request body must be a JSON object")
        return await _embed(state, body, [body.get("prompt")], legacy=True)


async def _pulled(state: ServerState, name: str) -> AsyncIterator[str]:
    """llmrun's verified pull of ``name`` (an alias or a Hub name), its progress as Ollama reports it."""
    import asyncio

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def put(item: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    def progress(file: str, done: int, total: int) -> None:
        put({"status": f"pulling {file}", "digest": file, "total": total, "completed": done})

    def work() -> None:
        from llmrun.backends import select
        from llmrun.config import load_registry
        from llmrun.refs import ModelRef
        from llmrun.resolve import resolve

        try:
            ref = ModelRef.parse(name)
            if ref.kind not in ("alias", "hub"):
                raise ModelNotFound(
                    f"{name!r} is not a name to pull", "pull an alias (gemma3:270m) or owner/repo[:QUANT]"
                )
            registry = load_registry()
            choice = select.choose_for(state.config.backend, name, ref, registry)
            resolve(ref, registry, progress, choice.backend)
            for status in ("verifying sha256 digest", "writing manifest", "success"):
                put({"status": status})
        except LlmrunError as exc:
            put({"error": explain(exc)})
        except Exception as exc:  # a bug: said, not hidden
            log.exception("pull failed")
            put({"error": f"the pull failed: {exc}"})
        finally:
            put(None)

    put({"status": "pulling manifest"})
    worker = threading.Thread(target=work, name=f"llmrun pull {name}", daemon=True)
    worker.start()
    while (item := await queue.get()) is not None:
        yield json.dumps(item) + "\n"


async def _served(state: ServerState, body: Any) -> Served:
    if isinstance(body, dict) and "model" not in body and isinstance(body.get("name"), str):
        body = {**body, "model": body["name"]}
    return await jobs.served_model(state, body)  # (an embedding model asked for text: a 400 that says so)


def _embedding(state: ServerState, name: str) -> bool:
    return name in {e.name for e in state.embeddings()}


async def _answer(
    request: Request, served: Served, call: ollama.OllamaCall, metrics: Metrics, started: float, *, chat: bool
) -> Response:
    """``started``: when the request came; the time until now went to finding (or loading) the model."""
    load_s = time.monotonic() - started
    engine_call = api.Call(call.model, (call.request,), call.stream, False, None)
    queue, tickets = jobs.submit(served, engine_call)
    if call.stream:
        lines = _lines(queue, tickets, served, engine_call, metrics, started, load_s, chat=chat)
        return StreamingResponse(lines, media_type="application/x-ndjson")
    try:
        [result] = await jobs.gather(request, queue, tickets, engine_call, metrics, started)
    except jobs.ClientGone:
        return Response(status_code=499)
    total = time.monotonic() - started
    answer = {"message": ollama.chat_message(result)} if chat else {"response": result.text}
    return JSONResponse({**_head(served), **answer, **ollama.final(result, total, load_s)})


async def _lines(
    queue: Any,
    tickets: list[Any],
    served: Served,
    call: api.Call,
    metrics: Metrics,
    started: float,
    load_s: float,
    *,
    chat: bool,
) -> AsyncIterator[str]:
    """One JSON object a line: each token's text, then the last with ``done: true`` and the timings."""
    request = call.requests[0]
    dialect = tool_dialect(served.scheduler.entry.templates, request) if chat else None
    text = TextStream(dialect) if dialect is not None else None  # with tools: text once it cannot be a call
    first = True
    try:
        while True:
            _, event = await queue.get()
            if first:
                metrics.time_to_first_token.observe(time.monotonic() - started)
                first = False
            if isinstance(event, LlmrunError):
                yield json.dumps({"error": jobs.request_error(event, call).message}) + "\n"
                return
            if isinstance(event, Result):
                jobs.tally(metrics, event, started)
                total = time.monotonic() - started
                last: dict[str, Any] = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
                if text is not None:  # the calls, read from the whole answer; any text not yet shown
                    message = ollama.chat_message(event)
                    if not event.tool_calls:
                        content = event.content or ""
                        message["content"] = content[len(text.shown) :] if content.startswith(text.shown) else ""
                    last = {"message": message}
                line = {**_head(served), **last, **ollama.final(event, total, load_s)}
                yield json.dumps(line, ensure_ascii=False) + "\n"
                return
            shown = text.feed(event.text) if text is not None else event.text
            if shown:
                piece = {"message": {"role": "assistant", "content": shown}} if chat else {"response": shown}
                yield json.dumps({**_head(served), **piece, "done": False}, ensure_ascii=False) + "\n"
    finally:
        jobs.cancel(tickets)


def _head(served: Served) -> dict[str, Any]:
    return {"model": served.name, "created_at": ollama.created_at()}


NO_DETAILS = {"parent_model": "", "format": "gguf", "family": "", "families": None}
NO_DETAILS |= {"parameter_size": "", "quantization_level": ""}


def _details(state: ServerState, name: str) -> dict[str, Any]:
    served = next((s for s in state.served() if s.name == name), None)
    if served is None:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": "",
            "families": None,
            "parameter_size": "",
            "quantization_level": "",
        }
    header = served.scheduler.entry.plan.header
    architecture = header.architecture
    return {
        "parent_model": "",
        "format": "mlx" if served.scheduler.entry.plan.backend == "mlx" else "gguf",
        "family": architecture,
        "families": [architecture],
        "parameter_size": "",
        "quantization_level": _quantization(served),
    }


def _quantization(served: Served) -> str:
    from llmrun.quantize.gguf import file_type

    plan = served.scheduler.entry.plan
    return "" if plan.backend == "mlx" else file_type(plan.header)


def _card(state: ServerState, name: str) -> dict[str, Any]:
    served = next((s for s in state.served() if s.name == name), None)
    size = served.scheduler.entry.plan.header.file_size if served is not None else 0
    return {
        "name": name,
        "model": name,
        "modified_at": ollama.created_at(),
        "size": size,
        "digest": "",
        "details": _details(state, name),
    }


def _expires(state: ServerState) -> str:
    keep = state.config.keep_alive
    horizon = time.time() + (keep if keep is not None else 10 * 365 * 24 * 3600)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(horizon))


def _show(state: ServerState, name: str, served: Served | None) -> dict[str, Any]:
    if served is None:
        return {
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": _details(state, name),
            "capabilities": ["embedding"],
        }
    plan = served.scheduler.entry.plan
    params = served.defaults
    parameters = [f"temperature {params.temperature}", f"top_k {params.top_k}", f"top_p {params.top_p}"]
    parameters += [f'stop "{s}"' for s in params.stop]
    return {
        "modelfile": f"FROM {plan.model.path}\n",
        "parameters": "\n".join(parameters),
        "template": served.scheduler.entry.templates.conversation,
        "details": _details(state, name),
        "model_info": {"general.architecture": plan.header.architecture, "general.context_length": served.n_ctx},
        "capabilities": ["completion", "tools"],
    }


async def _embed(state: ServerState, body: dict[str, Any], inputs: list[Any], *, legacy: bool) -> Response:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise ollama.OllamaError(400, "model is required")
    if not inputs or not all(isinstance(text, str) and text for text in inputs):
        field = "prompt" if legacy else "input"
        raise ollama.OllamaError(400, f"{field} must be a non-empty string or a list of them")
    started = time.monotonic()
    try:
        embedding = await run_in_threadpool(state.get_embedding, name)
    except LlmrunError as exc:
        error = jobs.model_error(state, name, exc)
        raise ollama.OllamaError(error.status, error.message) from None
    call = api.EmbeddingCall(name, tuple(inputs), False, None)
    vectors, tokens = await run_in_threadpool(jobs.embed_inputs, embedding, call)
    lists = [[float(x) for x in vector] for vector in vectors]
    if legacy:
        return JSONResponse({"embedding": lists[0]})
    total = int((time.monotonic() - started) * 1e9)
    return JSONResponse(
        {
            "model": embedding.name,
            "embeddings": lists,
            "total_duration": total,
            "load_duration": 0,
            "prompt_eval_count": tokens,
        }
    )
