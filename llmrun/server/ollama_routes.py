"""Ollama's API on the same server: what the ``ollama`` libraries, Open WebUI, Continue and LangChain's
ChatOllama call (``/api/version``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/generate``,
``/api/chat``, ``/api/embed``, ``/api/embeddings``), on the same engine, schedulers and models as the
OpenAI routes. Streams are NDJSON; errors are ``{"error": "…"}`` with Ollama's statuses."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from llmrun.api import limits, ollama
from llmrun.api import openai as api
from llmrun.api.errors import explain
from llmrun.engine.request import tool_dialect
from llmrun.engine.result import Result
from llmrun.errors import LlmrunError, ModelNotFound
from llmrun.server import jobs
from llmrun.server.metrics import Metrics
from llmrun.server.state import Served, ServerState, in_ollama
from llmrun.structured.textstream import TextStream

log = logging.getLogger("llmrun.server")


def add_routes(app: FastAPI, state: ServerState, metrics: Metrics) -> None:
    @app.get("/api/version")
    async def version() -> dict[str, Any]:
        return {"version": ollama.VERSION}

    @app.get("/api/tags")
    async def tags() -> dict[str, Any]:
        """What this server runs, and what Ollama's store holds (served from there when asked for)."""
        from llmrun.models.otherstores import ollama_models

        names = state.names()
        cards = [_card(state, name) for name in names]
        for listed in ollama_models():
            name = listed.name.removeprefix("ollama:")
            if listed.path is not None and name not in names:
                cards.append({**_card(state, name), "size": listed.size, "details": _details(None)})
        return {"models": cards}

    @app.get("/api/ps")
    async def ps() -> dict[str, Any]:
        models = [_running(state, served) for served in state.served()]
        models += [{**_card(state, e.name), "expires_at": _expires(None), "size_vram": 0} for e in state.embeddings()]
        return {"models": models}

    async def lifecycle(body: Any, *, chat: bool) -> Response | None:
        """Ollama's load and unload forms (an empty prompt or messages); None for a request to answer."""
        form = ollama.lifecycle(body, chat=chat)
        if form is None:
            return None
        kind, keep = form
        if kind == "load":
            served = await _served(state, body)
            state.keep(served, keep)
            head = _head(served)
        else:
            name = state.untagged(ollama.model_name(body))
            if name not in state.names() and not in_ollama(name):
                raise ollama.OllamaError(404, f"model {name!r} not found")
            await state.loading.run(state.unload, name)
            head = {"model": name, "created_at": ollama.created_at()}
        answer = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
        return JSONResponse({**head, **answer, "done": True, "done_reason": kind})

    @app.post("/api/show")
    async def show(request: Request) -> Response:
        name = state.untagged(ollama.show_name(await jobs.json_body(request, state.config.max_body_bytes)))
        if name not in state.names() and not in_ollama(name):
            raise ollama.OllamaError(404, f"model {name!r} not found")
        embedding = name in {e.name for e in state.embeddings()}
        served = None if embedding else await jobs.served_model(state, {"model": name})
        return JSONResponse(_show(served))

    @app.post("/api/generate")
    async def generate(request: Request) -> Response:
        started = time.monotonic()
        body = await jobs.json_body(request, state.config.max_body_bytes)
        formed = await lifecycle(body, chat=False)
        if formed is not None:
            return formed
        served = await _served(state, body)
        call = ollama.parse_generate(body, served.defaults, state.limits(served).max_tokens)
        state.keep(served, call.keep_alive)
        return await _answer(request, state, served, call, metrics, started, chat=False)

    @app.post("/api/chat")
    async def chat(request: Request) -> Response:
        started = time.monotonic()
        body = await jobs.json_body(request, state.config.max_body_bytes)
        formed = await lifecycle(body, chat=True)
        if formed is not None:
            return formed
        served = await _served(state, body)
        call = ollama.parse_chat(body, served.defaults, state.limits(served).max_tokens)
        state.keep(served, call.keep_alive)
        return await _answer(request, state, served, call, metrics, started, chat=True)

    @app.post("/api/pull")
    async def pull(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        name = ollama.model_name(body)
        if not state.config.allow_pull:
            raise ollama.OllamaError(403, "pulling is off on this server: its operator can start it with --allow-pull")
        stream = body.get("stream", True)
        if not _pulling.acquire(blocking=False):
            raise ollama.OllamaError(409, "a pull is already running on this server; retry when it has finished")
        statuses = _pulled(state, name.strip(), _pulling)
        if stream is not False:
            return StreamingResponse(statuses, media_type="application/x-ndjson")
        last: dict[str, Any] = {}
        async for line in statuses:
            last = json.loads(line)
        return JSONResponse(last, status_code=200 if "error" not in last else 500)

    @app.post("/api/embed")
    async def embed(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        raw = body.get("input") if isinstance(body, dict) else None
        return await _embed(state, body, raw if isinstance(raw, list) else [raw], legacy=False)

    @app.post("/api/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await jobs.json_body(request, state.config.max_body_bytes)
        return await _embed(state, body, [body.get("prompt") if isinstance(body, dict) else None], legacy=True)


_pulling = threading.Lock()  # one pull at a time: each one holds a thread and the network


def _pulled(state: ServerState, name: str, held: threading.Lock) -> AsyncIterator[str]:
    """llmrun's verified pull of ``name`` (an alias or a Hub name), started now in a thread of its own; its
    progress as Ollama reports it. ``held`` is released when the pull ends (the client gone or not)."""
    import asyncio

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def put(item: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    def progress(file: str, done: int, total: int) -> None:
        put({"status": f"pulling {file}", "digest": file, "total": total, "completed": done})

    def work() -> None:
        from llmrun.engine import select
        from llmrun.models.refs import ModelRef
        from llmrun.models.registry import load_registry
        from llmrun.models.resolve import resolve

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
            held.release()
            put(None)

    put({"status": "pulling manifest"})
    worker = threading.Thread(target=work, name=f"llmrun pull {name}", daemon=True)
    worker.start()
    return _lines_of(queue)


async def _lines_of(queue: Any) -> AsyncIterator[str]:
    while (item := await queue.get()) is not None:
        yield json.dumps(item) + "\n"


async def _served(state: ServerState, body: Any) -> Served:
    # (an embedding model asked for text: a 400 that says so)
    return await jobs.served_model(state, {"model": state.untagged(ollama.model_name(body))})


async def _answer(
    request: Request,
    state: ServerState,
    served: Served,
    call: ollama.OllamaCall,
    metrics: Metrics,
    started: float,
    *,
    chat: bool,
) -> Response:
    """``started``: when the request came; the time until now went to finding (or loading) the model."""
    load_s = time.monotonic() - started
    engine_call = api.Call(call.model, (call.request,), call.stream, False, None)
    queue, tickets = await jobs.submit(state, served, engine_call)
    if call.stream:
        lines = _lines(queue, tickets, served, engine_call, metrics, started, load_s, chat=chat)
        return StreamingResponse(lines, media_type="application/x-ndjson")
    try:
        [result] = await jobs.gather(request, queue, tickets, engine_call, metrics, started)
    except jobs.ClientGone:
        return Response(status_code=499)
    total = time.monotonic() - started
    answer = {"message": ollama.chat_message(result)} if chat else ollama.generate_answer(result)
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
    dialect = tool_dialect(served.scheduler.entry.templates, request) if chat and not served.remote else None
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
            if shown or event.reasoning:
                piece = ollama.stream_piece(shown, event.reasoning, chat=chat)
                yield json.dumps({**_head(served), **piece, "done": False}, ensure_ascii=False) + "\n"
    finally:
        jobs.cancel(tickets)


def _head(served: Served) -> dict[str, Any]:
    return {"model": served.name, "created_at": ollama.created_at()}


NO_DETAILS = {"parent_model": "", "format": "gguf", "family": "", "families": None}
NO_DETAILS |= {"parameter_size": "", "quantization_level": ""}


def _loaded(state: ServerState, name: str) -> Served | None:
    return next((s for s in state.served() if s.name == name), None)


def _details(served: Served | None) -> dict[str, Any]:
    if served is None:
        return dict(NO_DETAILS)
    plan = served.scheduler.entry.plan
    architecture = plan.header.architecture
    return {
        "parent_model": "",
        "format": "mlx" if plan.backend == "mlx" else "gguf",
        "family": architecture,
        "families": [architecture],
        "parameter_size": "",
        "quantization_level": _quantization(served),
    }


def _quantization(served: Served) -> str:
    from llmrun.formats.gguf_quantize import file_type

    plan = served.scheduler.entry.plan
    return "" if plan.backend == "mlx" else file_type(plan.header)


def _card(state: ServerState, name: str) -> dict[str, Any]:
    served = _loaded(state, name)
    return {
        "name": name,
        "model": name,
        "modified_at": ollama.created_at(),
        "size": served.scheduler.entry.plan.header.file_size if served is not None else 0,
        "digest": "",
        "details": _details(served),
    }


def _expires(seconds: float | None) -> str:
    """When a model is unloaded if nothing asks for it (Ollama's ``expires_at``; forever: years from now)."""
    horizon = time.time() + (seconds if seconds is not None else 10 * 365 * 24 * 3600)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(horizon))


def _running(state: ServerState, served: Served) -> dict[str, Any]:
    """A loaded model as Ollama's /api/ps lists it, with its memory (the plan's: weights + KV at its slots +
    overhead), context, and llmrun's slots."""
    scheduler = served.scheduler
    return {
        **_card(state, served.name),
        "size": served.memory,
        "size_vram": 0,
        "expires_at": _expires(state.expires_in(served)),
        "context_length": served.n_ctx,
        "llmrun": {
            "slots": scheduler.parallel if scheduler.batching else 1,
            "busy": scheduler.busy,
            "queued": scheduler.queued,
            "keep_alive": served.keep_alive,
            "remote": served.remote,
        },
    }


def _show(served: Served | None) -> dict[str, Any]:
    if served is None:
        return {
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": _details(None),
            "capabilities": ["embedding"],
        }
    plan = served.scheduler.entry.plan
    params = served.defaults
    parameters = [f"temperature {params.temperature}", f"top_k {params.top_k}", f"top_p {params.top_p}"]
    parameters += [f'stop "{s}"' for s in params.stop]
    return {
        "modelfile": f"FROM {plan.model.path.name}\n",  # (its file's name: a client never sees where it lies)
        "parameters": "\n".join(parameters),
        "template": served.scheduler.entry.templates.conversation,
        "details": _details(served),
        "model_info": {"general.architecture": plan.header.architecture, "general.context_length": served.n_ctx},
        "capabilities": ["completion", "tools", *(["vision"] if jobs.sees_images(served) else [])],
    }


async def _embed(state: ServerState, body: Any, inputs: list[Any], *, legacy: bool) -> Response:
    if not isinstance(body, dict):
        raise ollama.OllamaError(400, "the request body must be a JSON object")
    name = body.get("model")  # (Ollama's embedding requests name it so, never "name")
    if not isinstance(name, str) or not name:
        raise ollama.OllamaError(400, "model is required")
    name = state.untagged(name)
    if not inputs or not all(isinstance(text, str) and text for text in inputs):
        field = "prompt" if legacy else "input"
        raise ollama.OllamaError(400, f"{field} must be a non-empty string or a list of them")
    if len(inputs) > limits.MAX_INPUTS:
        raise ollama.OllamaError(400, f"input has {len(inputs):,} items; at most {limits.MAX_INPUTS:,} in one request")
    started = time.monotonic()
    embedding = await jobs.embedding_model(state, name)
    call = api.EmbeddingCall(name, tuple(inputs), False, None)
    vectors, tokens = await state.embedding.run(jobs.embed_inputs, embedding, call)
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
