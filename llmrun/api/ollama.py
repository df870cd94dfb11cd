"""Ollama request bodies in, engine requests out; engine results in, Ollama response bodies out (pure).

Follows Ollama's API documentation (``docs/api.md``) field by field for ``/api/generate``,
``/api/chat``, ``/api/embed`` and ``/api/embeddings``: ``options`` map onto
:class:`~llmrun.decoding.sampling.SamplingParams` (``num_predict`` → max_tokens, …), ``format`` is ``"json"``
or a JSON Schema (enforced while decoding), timings are nanoseconds, ``done_reason`` is ``stop`` or
``length``. A field llmrun cannot honour (``images``, ``template``, ``suffix``, ``context``) is a 400
naming it; errors are Ollama's ``{"error": "…"}``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from llmrun.api import limits
from llmrun.api.errors import ApiError, worded
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.request import Request
from llmrun.engine.result import Result
from llmrun.errors import InvalidParameter
from llmrun.models.otherstores import OLLAMA_PARAMS
from llmrun.prompt.template import Message, ToolCall
from llmrun.structured.formats import ANY_JSON, Format, from_schema
from llmrun.structured.tools import Tool, ToolUse

VERSION = "0.12.0"  # the Ollama API version whose fields this follows (clients check it)
# a limit cut the answer short: its max_tokens (num_predict), the context, or the server's time limit
DONE_REASON = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "time": "length"}
# options → SamplingParams fields: the names Ollama's parameters have in its store too (num_ctx and the
# other load-time options are the server's: see UNUSED_OPTIONS)
OPTIONS = {name: field for name, field in OLLAMA_PARAMS.items() if field != "n_ctx"}
# accepted and left to the server's own settings (a per-request context or thread count would mean a
# reload; Ollama reloads, llmrun serves the model as loaded)
UNUSED_OPTIONS = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread", "numa", "num_keep"}
GENERATE_FIELDS = {"model", "prompt", "system", "format", "options", "stream", "raw", "keep_alive", "images"}
GENERATE_FIELDS |= {"template", "suffix", "context", "think", "logprobs", "top_logprobs", "width", "height", "steps"}
CHAT_FIELDS = {"model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"}
CHAT_FIELDS |= {"logprobs", "top_logprobs"}
UNSUPPORTED = {
    "logprobs": "logprobs are not supported on Ollama's API here (use /v1/chat/completions)",
    "top_logprobs": "top_logprobs are not supported on Ollama's API here (use /v1/chat/completions)",
    "width": "image generation is not supported",
    "height": "image generation is not supported",
    "steps": "image generation is not supported",
    "template": "template is not supported: llmrun renders the model's own chat template (send raw: true instead)",
    "suffix": "suffix (fill-in-the-middle) is not supported",
    "context": "context is deprecated by Ollama and not supported: send the conversation to /api/chat",
}


def _limited(check: Any, value: Any, *more: Any) -> Any:
    """One of :mod:`llmrun.api.limits`' checks, its refusal in Ollama's shape."""
    try:
        return check(value, *more)
    except limits.OverLimit as exc:
        message = exc.message if exc.message.startswith(exc.field) else f"{exc.field}: {exc.message}"
        raise OllamaError(exc.status, message) from None


class OllamaError(ApiError):
    """An error as Ollama answers it: a status and ``{"error": message}`` (the app answers every
    :class:`ApiError` under /api/ in that shape)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)

    def body(self) -> dict[str, Any]:
        return {"error": self.message}


@dataclass(frozen=True, slots=True)
class OllamaCall:
    model: str
    request: Request
    stream: bool
    keep_alive: Any = None


def model_name(body: Any) -> str:
    """The model a body names (``model``, or ``name`` as older clients send it)."""
    if not isinstance(body, dict):
        raise OllamaError(400, "the request body must be a JSON object")
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model.strip():
        raise OllamaError(400, "model is required")
    return model


def _unsupported(body: dict[str, Any], allowed: set[str]) -> None:
    for name, value in body.items():
        if name not in allowed:
            raise OllamaError(400, f"unknown field {name!r}")
        if name in UNSUPPORTED and value not in (None, "", [], False):
            raise OllamaError(400, UNSUPPORTED[name])


def params(options: Any, defaults: SamplingParams, max_tokens: int = -1) -> SamplingParams:
    """Ollama's ``options`` as sampling parameters (over the model's defaults). ``max_tokens``: the server's
    ceiling, which is also what "no limit" (Ollama's default ``num_predict`` -1) becomes; -1: none."""
    if options is None:
        return dataclasses.replace(defaults, max_tokens=max_tokens)  # Ollama's default: until the model stops
    if not isinstance(options, dict):
        raise OllamaError(400, "options must be an object")
    values: dict[str, Any] = {"max_tokens": -1}
    for name, value in options.items():
        if name in UNUSED_OPTIONS:
            continue
        if name not in OPTIONS:
            raise OllamaError(400, f"unknown option {name!r}")
        if value is None:
            continue
        if name == "stop":
            values["stop"] = _limited(limits.stops, value, "options.stop")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise OllamaError(400, f"options.{name} must be a number")
        if name in ("num_predict", "seed", "top_k", "repeat_last_n") and value != int(value):
            raise OllamaError(400, f"options.{name} must be an integer")
        field = OPTIONS[name]
        values[field] = int(value) if field in ("max_tokens", "seed", "top_k", "repeat_last_n") else float(value)
    if values.get("max_tokens", -1) < -1 or values.get("max_tokens") == 0:
        values["max_tokens"] = -1  # Ollama: -1 (or -2, fill the context) means no limit
    if max_tokens != -1:
        if values["max_tokens"] > max_tokens:
            raise OllamaError(400, f"options.num_predict must be at most {max_tokens} (this server's limit per answer)")
        if values["max_tokens"] == -1:
            values["max_tokens"] = max_tokens
    try:
        return dataclasses.replace(defaults, **values)
    except InvalidParameter as exc:
        raise OllamaError(400, f"options.{_option(exc.name)}: {worded(exc.message)}") from None


def _option(field: str) -> str:
    return next((name for name, target in OPTIONS.items() if target == field), field)


def answer_format(value: Any) -> Format | None:
    """Ollama's ``format``: ``"json"`` or a JSON Schema object (``""``/null: none)."""
    if value in (None, ""):
        return None
    if value == "json":
        return ANY_JSON
    if isinstance(value, dict):
        try:
            return from_schema(value, parameter="format")
        except InvalidParameter as exc:
            raise OllamaError(400, f"format must be {exc.expected}") from None
    raise OllamaError(400, 'format must be "json" or a JSON Schema object')


def _stream(body: dict[str, Any]) -> bool:
    value = body.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(value, bool):
        raise OllamaError(400, "stream must be a boolean")
    return value


def parse_generate(body: Any, defaults: SamplingParams, max_tokens: int = -1) -> OllamaCall:
    model = model_name(body)
    _unsupported(body, GENERATE_FIELDS)
    prompt, system = body.get("prompt", ""), body.get("system")
    if not isinstance(prompt, str) or (system is not None and not isinstance(system, str)):
        raise OllamaError(400, "prompt and system must be strings")
    _limited(limits.prompt_size, [len(prompt) + len(system or "")], "prompt")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise OllamaError(400, "raw must be a boolean")
    think, variables = _think(body.get("think"))
    request = Request(
        prompt=prompt,
        images=_images(body.get("images"), "images"),
        params=params(body.get("options"), defaults, max_tokens),
        system=system or None,
        raw=raw,
        response_format=answer_format(body.get("format")),
        think=think,
        template_kwargs=variables,
    )
    return OllamaCall(model, request, _stream(body), keep_alive(body.get("keep_alive")))


def parse_chat(body: Any, defaults: SamplingParams, max_tokens: int = -1) -> OllamaCall:
    model = model_name(body)
    _unsupported(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OllamaError(400, "messages must be a non-empty list")
    _limited(limits.message_count, len(messages))
    sizes = [len(m["content"]) if isinstance(m, dict) and isinstance(m.get("content"), str) else 0 for m in messages]
    _limited(limits.prompt_size, sizes)
    parsed = tuple(_message(m, i) for i, m in enumerate(messages))
    tools = _tools(body.get("tools"))
    think, variables = _think(body.get("think"))
    request = Request(
        messages=parsed,
        params=params(body.get("options"), defaults, max_tokens),
        response_format=answer_format(body.get("format")),
        tools=tools,
        think=think,
        template_kwargs=variables,
    )
    return OllamaCall(model, request, _stream(body), keep_alive(body.get("keep_alive")))


def lifecycle(body: Any, *, chat: bool) -> tuple[str, float | str | None] | None:
    """Ollama's load and unload forms: a request with no prompt (or no messages) loads the model, or, with
    ``keep_alive: 0``, unloads it — ``("load" | "unload", keep_alive)``; None for a request to answer."""
    if not isinstance(body, dict):
        return None
    field = body.get("messages") if chat else body.get("prompt")
    if field not in (None, "", []):
        return None
    if chat:  # the rest of the body checked as a request's would be (a stand-in message for the empty list)
        parse_chat({**body, "messages": [{"role": "user", "content": "."}]}, SamplingParams())
    else:
        parse_generate(body, SamplingParams())
    keep = keep_alive(body.get("keep_alive"))
    return ("unload" if keep == 0 else "load"), keep


def keep_alive(value: Any) -> float | str | None:
    """Ollama's keep_alive: how long the model stays loaded after this request — a duration ("5m", "1h30m") or
    seconds; 0 unloads it at once, a negative value keeps it forever (None); absent: ``"default"`` (the
    server's --keep-alive)."""
    from llmrun.units import keep_alive as parsed

    try:
        return parsed(value)
    except ValueError:
        raise OllamaError(
            400, f'keep_alive must be a duration ("5m", "1h") or a number of seconds, not {value!r}'
        ) from None


SHOW_FIELDS = {"model", "name", "verbose"}


def show_name(body: Any) -> str:
    """/api/show's body: the model it names (``verbose`` is accepted; llmrun shows the same either way)."""
    name = model_name(body)
    _unsupported(body, SHOW_FIELDS)
    if not isinstance(body.get("verbose", False), bool):
        raise OllamaError(400, "verbose must be a boolean")
    return name


def _think(value: Any) -> tuple[bool | None, dict[str, Any]]:
    """Ollama's ``think``: true or false (the template's enable_thinking), or a level (gpt-oss's
    reasoning_effort: high, medium, low)."""
    if value is None or isinstance(value, bool):
        return value, {}
    if value in ("high", "medium", "low"):
        return True, {"reasoning_effort": value}
    raise OllamaError(400, "think must be true, false, or high, medium or low")


def _images(value: Any, where: str) -> tuple[bytes, ...]:
    """Ollama's ``images``: base64 strings of PNG, JPEG, GIF or BMP files (never paths or URLs)."""
    from llmrun.api.images import BadImage, from_base64

    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise OllamaError(400, f"{where} must be an array of base64 strings")
    try:
        return tuple(from_base64(v) for v in value)
    except BadImage as exc:
        raise OllamaError(400, f"{where}: {exc}") from None


def _message(value: Any, index: int) -> Message:
    where = f"messages[{index}]"
    if not isinstance(value, dict):
        raise OllamaError(400, f"{where} must be an object")
    role, content = value.get("role"), value.get("content", "")
    if role not in ("system", "user", "assistant", "tool"):
        raise OllamaError(400, f"{where}.role must be system, user, assistant or tool")
    images = _images(value.get("images"), f"{where}.images")
    if images and role != "user":
        raise OllamaError(400, f"{where}.images: images go in user messages")
    if not isinstance(content, str):
        raise OllamaError(400, f"{where}.content must be a string")
    calls = tuple(_call(c, f"{where}.tool_calls[{j}]", j) for j, c in enumerate(value.get("tool_calls") or ()))
    for field in ("tool_name", "name"):
        if value.get(field) is not None and not isinstance(value[field], str):
            raise OllamaError(400, f"{where}.{field} must be a string")
    name = value.get("tool_name") or value.get("name")
    thinking = value.get("thinking")
    if thinking is not None and not isinstance(thinking, str):
        raise OllamaError(400, f"{where}.thinking must be a string")
    return Message(
        role,
        content,
        calls,
        name=name if role == "tool" and isinstance(name, str) else None,
        reasoning=thinking if role == "assistant" and thinking else None,
        images=images,
    )


def _call(value: Any, where: str, index: int) -> ToolCall:
    import json

    function = value.get("function") if isinstance(value, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise OllamaError(400, f'{where} must be {{"function": {{"name", "arguments"}}}}')
    arguments = function.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(f"call_{index}", function["name"], text)


def _tools(value: Any) -> ToolUse | None:
    import json

    if not value:
        return None
    if not isinstance(value, list):
        raise OllamaError(400, "tools must be a list")
    _limited(limits.tool_count, len(value))
    tools = []
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise OllamaError(400, f'tools[{i}] must be {{"type": "function", "function": {{"name", ...}}}}')
        name = _limited(limits.tool_name, function["name"], f"tools[{i}].function.name")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise OllamaError(400, f"tools[{i}].function.parameters must be a JSON Schema object")
        text = json.dumps(parameters, ensure_ascii=False)
        _limited(limits.schema_size, text, f"tools[{i}].function.parameters")
        tools.append(Tool(name, str(function.get("description") or ""), text))
    _limited(limits.tool_names, [t.name for t in tools])
    return ToolUse(tuple(tools), "auto")


# --- responses --------------------------------------------------------------------------------


def created_at() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def timings(result: Result, total_s: float, load_s: float) -> dict[str, Any]:
    """Ollama's usage fields, in nanoseconds."""
    decode_s = result.generated_tokens / result.generation_tokens_per_s if result.generation_tokens_per_s else 0.0
    return {
        "total_duration": int(total_s * 1e9),
        "load_duration": int(load_s * 1e9),
        "prompt_eval_count": result.prompt_tokens,
        "prompt_eval_duration": int(result.time_to_first_token_s * 1e9),
        "eval_count": result.generated_tokens,
        "eval_duration": int(decode_s * 1e9),
    }


def chat_message(result: Result) -> dict[str, Any]:
    import json

    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    if result.content is not None or result.tool_calls:
        message["content"] = result.content or ""
    if result.reasoning is not None:
        message["thinking"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [
            {"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in result.tool_calls
        ]
    return message


def generate_answer(result: Result) -> dict[str, Any]:
    """/api/generate's answer: the response, and a reasoning model's reasoning as ``thinking``."""
    return {"response": result.text, **({"thinking": result.reasoning} if result.reasoning is not None else {})}


def stream_piece(text: str, reasoning: str, *, chat: bool) -> dict[str, Any]:
    """One streamed line's text: the answer, and reasoning as ``thinking`` (Ollama's field)."""
    thinking = {"thinking": reasoning} if reasoning else {}
    return {"message": {"role": "assistant", "content": text, **thinking}} if chat else {"response": text, **thinking}


def final(result: Result, total_s: float, load_s: float) -> dict[str, Any]:
    return {"done": True, "done_reason": DONE_REASON[result.finish_reason], **timings(result, total_s, load_s)}
