"""OpenAI request bodies in, engine requests out; engine results in, OpenAI response bodies out (pure).

Follows OpenAI's API reference field by field. A field OpenAI defines that llmrun
cannot honour is a 400 naming it (never silently ignored); a field OpenAI does not
define is a 400 too, as OpenAI answers. The extra sampling fields llama-server and
vLLM accept (``top_k``, ``min_p``, ``repeat_penalty`` or ``repetition_penalty``, ``repeat_last_n``)
are accepted. Sampling values are validated by :class:`~llmrun.decoding.sampling.SamplingParams`, the CLI's own rules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmrun.api import limits as limits_
from llmrun.api.errors import ApiError, bad_field, over_limit, worded
from llmrun.api.openai_tools import parse_response_format, parse_tool_calls, parse_tools, tool_calls_json
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.request import Request
from llmrun.engine.result import Result
from llmrun.errors import InvalidParameter
from llmrun.prompt.template import OWN_VARIABLES, Message

# "length": a limit cut the answer short: max_tokens, the context, or the server's --request-timeout
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "time": "length"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_TOP_LOGPROBS = 20

# the sampling fields a body may set, by the SamplingParams field they set
SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "top_k": "top_k",
    "min_p": "min_p",
    "repeat_penalty": "repeat_penalty",
    "repetition_penalty": "repeat_penalty",  # vLLM's name for it
    "repeat_last_n": "repeat_last_n",  # llama-server's
}
COMMON = {"model", "stream", "stream_options", "n", "stop", "max_tokens", "user", "keep_alive", *SAMPLING}
CHAT_FIELDS = COMMON | {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "store",
    "metadata",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "reasoning_effort",
    "continue_final_message",
}
COMPLETION_FIELDS = COMMON | {"prompt", "logprobs", "echo", "suffix", "best_of", "response_format"}
# OpenAI fields llmrun does not do: a 400 that names them
UNSUPPORTED = {
    "functions": "functions are deprecated by OpenAI and not supported: send tools",
    "function_call": "function_call is deprecated by OpenAI and not supported: send tool_choice",
    "logit_bias": "logit_bias is not supported",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "service_tier": "service_tier is not supported",
    "verbosity": "verbosity is not supported",
}


@dataclass(frozen=True, slots=True)
class Limits:
    max_tokens: int  # the most tokens one answer may ask for (the server's --max-tokens, at most the context per slot)
    max_n: int = 8
    max_messages: int = limits_.MAX_MESSAGES
    default_tokens: int = (
        -1
    )  # an answer's max_tokens when the request gives none (-1: until it stops or fills the context)
    request_timeout_s: float | None = None  # the server's time limit per request (published in /openapi.json)


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request's worth of engine requests (``n`` choices, or one per prompt × n)."""

    model: str
    requests: tuple[Request, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None  # None: not asked; else the alternatives per token
    n: int = 1  # choices per prompt: requests are each prompt's n choices in turn
    keep_alive: float | str | None = "default"  # llmrun's field, as Ollama's: seconds, None (forever), "default"


def _check_fields(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    for name in body:
        if name in UNSUPPORTED:
            raise bad_field(name, UNSUPPORTED[name], "unsupported_parameter")
        if name not in allowed:
            raise bad_field(name, f"unrecognized request argument supplied: {name}", "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_field("model", "model is required: a string naming a model this server runs", "missing_required")
    return body


def _typed(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise bad_field(name, f"{name} must be {what}, got {value!r}", "invalid_type")
    if not isinstance(value, kinds):
        raise bad_field(name, f"{name} must be {what}, got {type(value).__name__}", "invalid_type")
    return value


def _params(
    body: dict[str, Any], defaults: SamplingParams, limits: Limits, max_tokens_field: str | None
) -> SamplingParams:
    values: dict[str, Any] = {}
    for name, target in SAMPLING.items():
        value = body.get(name)
        if value is None:
            continue
        integer = target in ("seed", "top_k", "repeat_last_n")
        kinds: tuple[type, ...] = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise bad_field(name, f"{name} must be {'an integer' if integer else 'a number'}", "invalid_type")
        if isinstance(value, float) and not math.isfinite(value):
            raise bad_field(name, f"{name} must be a finite number")
        values[target] = value
    if "temperature" in values and values["temperature"] > 2:
        raise bad_field("temperature", f"temperature must be in [0, 2], got {values['temperature']}")
    stop = body.get("stop")
    if stop is not None:
        try:
            values["stop"] = limits_.stops(stop)
        except limits_.OverLimit as exc:
            raise over_limit(exc) from None
    if max_tokens_field is not None:
        max_tokens = _typed(body, max_tokens_field, int, "an integer")
        if max_tokens is not None:
            if not 1 <= max_tokens <= limits.max_tokens:
                raise bad_field(max_tokens_field, f"{max_tokens_field} must be in [1, {limits.max_tokens}]")
            values["max_tokens"] = max_tokens
        else:
            values["max_tokens"] = limits.default_tokens  # OpenAI's: until it stops or fills the context
    try:
        return dataclasses.replace(defaults, **values)
    except InvalidParameter as exc:
        raise bad_field(exc.name, worded(exc.message)) from None


def _choices(body: dict[str, Any], limits: Limits) -> int:
    n = _typed(body, "n", int, "an integer")
    if n is None:
        return 1
    if not 1 <= n <= limits.max_n:
        raise bad_field("n", f"n must be in [1, {limits.max_n}]")
    return int(n)


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = bool(_typed(body, "stream", bool, "a boolean"))
    options = _typed(body, "stream_options", dict, "an object")
    if options is None:
        return stream, False
    if not stream:
        raise bad_field("stream_options", "stream_options goes with stream: true")
    unknown = set(options) - {"include_usage", "include_obfuscation"}
    if unknown:
        raise bad_field("stream_options", f"unknown stream_options field: {sorted(unknown)[0]}", "unknown_parameter")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise bad_field("stream_options.include_usage", "include_usage must be a boolean", "invalid_type")
    return stream, usage


def _user(body: dict[str, Any]) -> None:
    _typed(body, "user", str, "a string")


def keep_alive(body: dict[str, Any]) -> float | str | None:
    """llmrun's ``keep_alive`` (Ollama's meaning): how long the model stays loaded after this request — a
    duration ("5m") or seconds, 0 unloads it after the answer, negative keeps it; absent: the server's."""
    from llmrun.units import keep_alive as parsed

    try:
        return parsed(body.get("keep_alive"))
    except ValueError:
        raise bad_field("keep_alive", 'keep_alive must be a duration ("5m", "1h") or a number of seconds') from None


def _seeded(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index`` of n: its own seed, so n samples differ but a seeded request repeats."""
    if index == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + index) % (2**32))


def _content(value: Any, where: str, images_allowed: bool = False) -> tuple[str, tuple[bytes, ...]]:
    """A message's text, and its images (``image_url`` parts: data URLs; a user message's only), which the
    model reads before the text."""
    from llmrun.api.images import BadImage, from_url

    if isinstance(value, str):
        return value, ()
    if not isinstance(value, list):
        raise bad_field(where, f"{where} must be a string or an array of content parts", "invalid_type")
    texts: list[str] = []
    images: list[bytes] = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url" and images_allowed:
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str):
                raise bad_field(
                    f"{where}[{j}].image_url",
                    'an image_url part is {"type": "image_url", "image_url": {"url": "data:…"}}',
                )
            try:
                images.append(from_url(url))
            except BadImage as exc:
                raise bad_field(f"{where}[{j}].image_url", str(exc), "invalid_image") from None
        elif kind in ("image_url", "input_audio", "file", "image"):
            raise bad_field(f"{where}[{j}]", f"{kind} content is not supported here (images go in user messages)")
        else:
            raise bad_field(f"{where}[{j}]", 'a content part must be {"type": "text", "text": "..."}')
    return "".join(texts), tuple(images)


MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal"}
MESSAGE_FIELDS |= {"reasoning_content", "reasoning", "audio"}


def _size(message: Any) -> int:
    """A message's characters: its text parts (images and the rest are bounded by the body's size)."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return len(content)
    parts = content if isinstance(content, list) else []
    return sum(len(p["text"]) for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def parse_messages(messages: Any, limits: Limits) -> tuple[Message, ...]:
    if not isinstance(messages, list) or not messages:
        raise bad_field("messages", "messages must be a non-empty array", "missing_required")
    try:
        limits_.message_count(len(messages))
        limits_.prompt_size([_size(m) for m in messages])
    except limits_.OverLimit as exc:
        raise over_limit(exc) from None
    if len(messages) > limits.max_messages:
        raise bad_field("messages", f"at most {limits.max_messages} messages")
    parsed = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_field(where, f"{where} must be an object", "invalid_type")
        unknown = sorted(set(message) - MESSAGE_FIELDS)
        if unknown:
            raise bad_field(f"{where}.{unknown[0]}", f"unrecognized message field: {unknown[0]}", "unknown_parameter")
        if message.get("name") is not None and not isinstance(message["name"], str):
            raise bad_field(f"{where}.name", "name must be a string", "invalid_type")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_field(f"{where}.role", f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if message.get("function_call"):
            raise bad_field(f"{where}.function_call", "function_call is deprecated: send tool_calls")
        calls = message.get("tool_calls")
        if calls is not None and role != "assistant":
            raise bad_field(f"{where}.tool_calls", "only assistant messages carry tool_calls")
        call_id = message.get("tool_call_id")
        if role == "tool" and (not isinstance(call_id, str) or not call_id):
            raise bad_field(f"{where}.tool_call_id", "a tool message needs the tool_call_id it answers")
        content = message.get("content")
        if content is None and role == "assistant":
            content = ""
        text, images = _content(content, f"{where}.content", images_allowed=role == "user")
        parsed.append(
            Message(
                ROLES[role],
                text,
                images=images,
                tool_calls=parse_tool_calls(calls, f"{where}.tool_calls") if calls else (),
                tool_call_id=call_id if role == "tool" else None,
                name=message.get("name") if role == "tool" and isinstance(message.get("name"), str) else None,
                reasoning=_reasoning(message, where) if role == "assistant" else None,
            )
        )
    return tuple(parsed)


def _reasoning(message: dict[str, Any], where: str) -> str | None:
    """An assistant message's earlier reasoning, as llama-server and DeepSeek send it back
    (``reasoning_content``; OpenRouter's ``reasoning``), for templates that show it."""
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise bad_field(f"{where}.{name}", f"{name} must be a string", "invalid_type")
            return value
    return None


def parse_chat(body: Any, defaults: SamplingParams, limits: Limits) -> Call:
    body = _check_fields(body, CHAT_FIELDS)
    if _typed(body, "store", bool, "a boolean"):
        raise bad_field("store", "store: true is not supported (this server keeps nothing)", "unsupported_parameter")
    _typed(body, "metadata", dict, "an object")
    _user(body)
    stream, include_usage = _stream(body)
    n = _choices(body, limits)
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise bad_field("max_tokens", "give max_completion_tokens or max_tokens, not both")
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    params = _params(body, defaults, limits, field)
    want = bool(_typed(body, "logprobs", bool, "a boolean"))
    top = _typed(body, "top_logprobs", int, "an integer")
    if top is not None and not want:
        raise bad_field("top_logprobs", "top_logprobs needs logprobs: true")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise bad_field("top_logprobs", f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]")
    alternatives: int | None = int(top or 0) if want else None
    messages = parse_messages(body.get("messages"), limits)
    think, template_kwargs = template_variables(body)
    per_token = max(int(top or 0), 1) if want else 0
    fmt, tools = parse_response_format(body), parse_tools(body)
    continue_final = bool(_typed(body, "continue_final_message", bool, "a boolean"))
    try:  # (what a Request checks itself — continue_final_message with the assistant's message last — is a 400)
        requests = tuple(
            Request(
                messages=messages,
                params=_seeded(params, i),
                logprobs=per_token,
                response_format=fmt,
                tools=tools,
                think=think,
                template_kwargs=template_kwargs,
                continue_final=continue_final,
            )
            for i in range(n)
        )
    except InvalidParameter as exc:
        raise bad_field(exc.name, worded(exc.message)) from None
    return Call(body["model"], requests, stream, include_usage, alternatives, n, keep_alive(body))


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")


def template_variables(body: dict[str, Any]) -> tuple[bool | None, dict[str, Any]]:
    """``chat_template_kwargs`` (vLLM's and llama-server's: extra chat-template variables, such as
    ``enable_thinking``) and ``reasoning_effort`` (a template variable; ``none`` turns reasoning off)."""
    kwargs = dict(_typed(body, "chat_template_kwargs", dict, "an object") or {})
    reserved = sorted(OWN_VARIABLES & set(kwargs))
    if reserved:
        raise bad_field("chat_template_kwargs", f"chat_template_kwargs cannot set {reserved[0]}: llmrun sets it")
    effort = _typed(body, "reasoning_effort", str, "a string")
    think: bool | None = None
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise bad_field("reasoning_effort", f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}")
        kwargs.setdefault("reasoning_effort", effort)
        think = effort != "none"
    enable = kwargs.pop("enable_thinking", None)
    if enable is not None and not isinstance(enable, bool):
        raise bad_field("chat_template_kwargs", "chat_template_kwargs.enable_thinking must be a boolean")
    return (enable if enable is not None else think), kwargs


def parse_completion(body: Any, defaults: SamplingParams, limits: Limits) -> Call:
    body = _check_fields(body, COMPLETION_FIELDS)
    _user(body)
    best_of = body.get("best_of")
    for name, unused in (
        ("echo", not body.get("echo")),
        ("suffix", not body.get("suffix")),
        ("best_of", best_of in (None, 1) and not isinstance(best_of, bool)),
    ):
        if not unused:
            raise bad_field(name, f"{name} is not supported", "unsupported_parameter")
    stream, include_usage = _stream(body)
    n = _choices(body, limits)
    params = _params(body, defaults, limits, "max_tokens")
    if body.get("max_tokens") is None:
        params = dataclasses.replace(params, max_tokens=min(16, limits.max_tokens))  # OpenAI's default for completions
    logprobs = _typed(body, "logprobs", int, "an integer")
    if logprobs is not None and not 0 <= logprobs <= 5:
        raise bad_field("logprobs", "logprobs must be in [0, 5]")
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise bad_field("prompt", "prompt must be a string or a non-empty array of strings", "invalid_type")
    try:
        limits_.prompt_size([len(p) for p in prompts], "prompt")
    except limits_.OverLimit as exc:
        raise over_limit(exc) from None
    if len(prompts) * n > limits.max_n * 4:
        raise bad_field("prompt", f"at most {limits.max_n * 4} choices (prompts × n) in one request")
    fmt = parse_response_format(body)
    requests = tuple(
        Request(
            prompt=p,
            params=_seeded(params, i),
            raw=True,
            logprobs=max(logprobs, 1) if logprobs is not None else 0,
            response_format=fmt,
        )
        for p in prompts
        for i in range(n)
    )
    return Call(body["model"], requests, stream, include_usage, logprobs, n, keep_alive(body))


# --- responses ------------------------------------------------------------------------


def usage(results: Sequence[Result], n: int = 1) -> dict[str, Any]:
    """OpenAI's usage object for ``results`` in choice order, ``n`` choices per prompt: each prompt
    counts once, as OpenAI counts it; ``cached_tokens`` are those an earlier request's KV cells held;
    speculative decoding's drafted tokens are reported as OpenAI reports predicted outputs' (kept:
    ``accepted_prediction_tokens``, refused: ``rejected_prediction_tokens``)."""
    firsts = results[::n]
    prompt = sum(r.prompt_tokens for r in firsts)
    completion = sum(r.generated_tokens for r in results)
    cached = sum(r.cached_tokens for r in firsts)
    accepted = sum(r.accepted for r in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(r.drafted for r in results) - accepted,
        },
    }


def chat_logprobs(result: Result, alternatives: int) -> dict[str, Any]:
    entries = result.logprobs or ()

    def one(piece: bytes, logprob: float) -> dict[str, Any]:
        return {"token": piece.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(piece)}

    return {
        "content": [
            {**one(e.piece, e.logprob), "top_logprobs": [one(c.piece, c.logprob) for c in e.top[:alternatives]]}
            for e in entries
        ],
        "refusal": None,
    }


def completion_logprobs(result: Result, alternatives: int) -> dict[str, Any]:
    entries = result.logprobs or ()
    offsets, offset = [], 0
    for e in entries:
        offsets.append(offset)
        offset += len(e.piece.decode("utf-8", "replace"))
    return {
        "tokens": [e.piece.decode("utf-8", "replace") for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [
            {c.piece.decode("utf-8", "replace"): c.logprob for c in e.top[:alternatives]} for e in entries
        ],
        "text_offset": offsets,
    }


def finish_reason(result: Result) -> str:
    return "tool_calls" if result.tool_calls else FINISH[result.finish_reason]


def chat_choice(index: int, result: Result, alternatives: int | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text, "refusal": None}
    if result.tool_calls:
        message = {**message, "content": result.content, "tool_calls": tool_calls_json(result.tool_calls)}
    elif result.content is not None:  # tools were offered and the model answered in text
        message["content"] = result.content
    if result.reasoning is not None:  # llama-server's and DeepSeek's field
        message["reasoning_content"] = result.reasoning
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(result, alternatives) if alternatives is not None else None,
        "finish_reason": finish_reason(result),
    }


def completion_choice(index: int, result: Result, alternatives: int | None) -> dict[str, Any]:
    return {
        "index": index,
        "text": result.text,
        "logprobs": completion_logprobs(result, alternatives) if alternatives is not None else None,
        "finish_reason": FINISH[result.finish_reason],
    }


# --- embeddings ---------------------------------------------------------------------------

EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}


@dataclass(frozen=True, slots=True)
class EmbeddingCall:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]  # texts, or token ids of the model's own vocabulary
    base64: bool
    dimensions: int | None


def parse_embeddings(body: Any) -> EmbeddingCall:
    body = _check_fields(body, EMBEDDING_FIELDS)
    _user(body)
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_field("encoding_format", "encoding_format must be float or base64")
    dimensions = _typed(body, "dimensions", int, "an integer")
    raw = body.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(_is_int(x) for x in raw)):
        items: list[Any] = [raw]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise bad_field("input", "input must be a string, an array of strings, or token arrays", "invalid_type")
    try:
        limits_.input_count(len(items))
    except limits_.OverLimit as exc:
        raise over_limit(exc) from None
    inputs: list[str | tuple[int, ...]] = []
    for i, item in enumerate(items):
        if isinstance(item, str) and item:
            inputs.append(item)
        elif isinstance(item, list) and item and all(_is_int(x) and x >= 0 for x in item):
            inputs.append(tuple(item))
        else:
            raise bad_field(f"input[{i}]", "each input must be a non-empty string or a non-empty token array")
    return EmbeddingCall(body["model"], tuple(inputs), encoding == "base64", dimensions)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def embedding_item(index: int, vector: Any, base64: bool) -> dict[str, Any]:
    import base64 as b64

    import numpy as np

    values = np.asarray(vector, dtype="<f4")
    encoded: Any = b64.b64encode(values.tobytes()).decode("ascii") if base64 else values.tolist()
    return {"object": "embedding", "index": index, "embedding": encoded}
