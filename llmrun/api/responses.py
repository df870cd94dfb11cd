"""OpenAI's Responses API (``POST /v1/responses``): bodies in, an engine request out; a result in, a Response
object out (pure). What Codex CLI and the ``openai`` SDK's ``responses.create`` send.

Follows OpenAI's API reference field by field. ``input`` is a string or items: ``message`` (roles ``user``,
``assistant``, ``system``, ``developer``; parts ``input_text``, ``input_image`` as a data URL,
``output_text``, ``refusal``), ``function_call``, ``function_call_output`` and ``reasoning``;
``instructions`` go first. ``tools`` are functions, and ``namespace`` groups of them, flattened to
``namespace__name`` for the model and given back under the names the client knows; hosted tools that run
at OpenAI (``web_search``, ``file_search``, ``code_interpreter``…) and freeform ``custom`` tools are left
out of the prompt and named in the response's ``llmrun-skipped-tools`` header. ``text.format`` is
structured output as on the chat route. A response asking more than the server's ``--max-tokens`` is cut
there and ends ``incomplete`` (agents ask for their whole budget). What real clients send and llmrun cannot
honour is accepted and left aside (:data:`IGNORED`); a field OpenAI does not define is a 400 naming it.

A conversation continues with ``previous_response_id``: the route hands the stored conversation in as
``earlier`` items, and :func:`stored` is what it keeps.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

from llmrun.api import limits
from llmrun.api.errors import ApiError, bad_field, over_limit, worded
from llmrun.api.openai import REASONING_EFFORTS, Limits, keep_alive
from llmrun.api.responses_input import SEPARATOR, conversation, input_items, new_id
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.request import Request
from llmrun.engine.result import Result
from llmrun.errors import InvalidParameter
from llmrun.prompt.template import ToolCall
from llmrun.structured.formats import Format, from_schema, response_format
from llmrun.structured.tools import Tool, ToolUse

FIELDS = {"model", "input", "instructions", "stream", "store", "previous_response_id", "max_output_tokens"}
FIELDS |= {"temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning", "metadata"}
FIELDS |= {"include", "truncation", "stream_options", "background", "user", "keep_alive"}  # keep_alive: llmrun's
IGNORED = {  # sent by real clients, accepted and left aside (docs/agents.md says why each one)
    "prompt_cache_key",  # the prefix cache keeps every prefix without a key
    "prompt_cache_retention",
    "prompt_cache_options",
    "safety_identifier",  # for OpenAI's abuse checks
    "service_tier",  # OpenAI's capacity tiers
    "client_metadata",  # Codex CLI's session ids
    "context_management",  # server-side compaction: the client resends what it keeps
    "max_tool_calls",  # the model's calls are answered by the client, which decides how many to run
    "moderation",
    "access_programs",
    "image",
}
UNSUPPORTED = {
    "conversation": "conversations are not kept here: continue with previous_response_id",
    "prompt": "stored prompt templates live at OpenAI: send the instructions and input",
    "top_logprobs": "top_logprobs is not supported on /v1/responses: ask /v1/chat/completions",
}
INCOMPLETE = {"length", "context", "time"}


@dataclass(frozen=True, slots=True)
class ResponsesCall:
    model: str
    request: Request
    stream: bool
    store: bool
    items: tuple[dict[str, Any], ...]  # the input as items, each with an id (input_items; the conversation)
    echo: dict[str, Any]  # what the Response object repeats of the request
    names: dict[str, tuple[str, str]]  # a flattened tool name: (namespace, name)
    skipped_tools: tuple[str, ...] = ()  # hosted tools that cannot run here
    keep_alive: float | str | None = "default"  # llmrun's field (Ollama's meaning)


def parse_create(
    body: Any,
    defaults: SamplingParams,
    limits_: Limits,
    earlier: tuple[dict[str, Any], ...] = (),
    images_allowed: bool = True,
) -> ResponsesCall:
    """``POST /v1/responses``; ``earlier``: the conversation of the response it continues (its items)."""
    body = _check_fields(body)
    stream = _flag(body, "stream", False)
    store = _flag(body, "store", True)
    if _flag(body, "background", False):
        raise bad_field("background", "background responses are not supported: stream instead", "unsupported_parameter")
    for name in ("user", "previous_response_id", "instructions", "truncation"):
        _typed(body, name, str, "a string")
    if body.get("truncation") not in (None, "auto", "disabled"):
        raise bad_field("truncation", "truncation must be auto or disabled")
    _typed(body, "metadata", dict, "an object")
    _include(body.get("include"))
    _stream_options(body.get("stream_options"), stream)
    items = input_items(body.get("input"))
    instructions = body.get("instructions") or ""
    names: dict[str, tuple[str, str]] = {}
    tools, skipped = _tools(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"), names)
    params, asked = _params(body, defaults, limits_)
    think, kwargs, reasoning = _reasoning(body.get("reasoning"))
    try:
        request = Request(
            messages=conversation(instructions, (*earlier, *items), names, images_allowed),
            params=params,
            tools=tools,
            think=think,
            template_kwargs=kwargs,
            response_format=_text_format(body.get("text")),
        )
    except InvalidParameter as exc:
        raise bad_field(exc.name, worded(exc.message)) from None
    echo = {
        "instructions": body.get("instructions"),
        "max_output_tokens": asked,
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": reasoning,
        "store": store,
        "temperature": params.temperature if body.get("temperature") is not None else 1.0,
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") in FUNCTION_KINDS],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
    }
    kept = keep_alive(body)
    return ResponsesCall(body["model"], request, stream, store, items, echo, names, tuple(skipped), kept)


def parse_count(body: Any, earlier: tuple[dict[str, Any], ...] = ()) -> Request:
    """``POST /v1/responses/input_tokens``: the conversation whose tokens are counted."""
    fields = FIELDS - {"stream", "store", "max_output_tokens", "temperature", "top_p", "stream_options", "keep_alive"}
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    unknown = sorted(set(body) - fields - IGNORED)
    if unknown:
        raise bad_field(unknown[0], f"unrecognized request argument supplied: {unknown[0]}", "unknown_parameter")
    call = parse_create({**body, "store": False}, SamplingParams(), Limits(max_tokens=1), earlier)
    return dataclasses.replace(call.request, params=SamplingParams())


def _check_fields(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    for name in body:
        if name in UNSUPPORTED and body[name] is not None:
            raise bad_field(name, UNSUPPORTED[name], "unsupported_parameter")
        if name not in FIELDS and name not in IGNORED and name not in UNSUPPORTED:
            raise bad_field(name, f"unrecognized request argument supplied: {name}", "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_field("model", "model is required: a string naming a model this server runs", "missing_required")
    return body


def _typed(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)):
        raise bad_field(name, f"{name} must be {what}", "invalid_type")
    return value


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = _typed(body, name, bool, "a boolean")
    return default if value is None else bool(value)


INCLUDES = {
    "reasoning.encrypted_content",  # there is none to include: reasoning is given as text
    "message.output_text.logprobs",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
}


def _include(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_field("include", "include must be an array of strings", "invalid_type")
    wrong = [v for v in value if v not in INCLUDES]
    if wrong:
        raise bad_field("include", f"include: unknown value {wrong[0]!r}")


def _stream_options(value: Any, stream: bool) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) - {"include_obfuscation"}:
        raise bad_field("stream_options", 'stream_options is {"include_obfuscation": bool}')
    if not stream:
        raise bad_field("stream_options", "stream_options goes with stream: true")


def _params(body: dict[str, Any], defaults: SamplingParams, limits_: Limits) -> tuple[SamplingParams, int | None]:
    """The sampling values, and the max_output_tokens asked (an answer is cut at the server's ceiling)."""
    values: dict[str, Any] = {}
    for name, high in (("temperature", 2.0), ("top_p", 1.0)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
            raise bad_field(name, f"{name} must be a number in [0, {high:g}]")
        values[name] = float(value)
    asked = body.get("max_output_tokens")
    if asked is not None:
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 16:
            raise bad_field("max_output_tokens", "max_output_tokens must be an integer of at least 16")
        values["max_tokens"] = min(asked, limits_.max_tokens)
    else:
        values["max_tokens"] = limits_.default_tokens
    try:
        return dataclasses.replace(defaults, **values), asked
    except InvalidParameter as exc:
        raise bad_field(exc.name, worded(exc.message)) from None


def _reasoning(value: Any) -> tuple[bool | None, dict[str, Any], dict[str, Any]]:
    """``reasoning``: ``effort`` (a template variable; ``none`` turns thinking off) and ``summary`` (the
    thinking is always given whole as the reasoning item's summary). Returns think, template variables and
    the object the Response repeats."""
    if value is None:
        return None, {}, {"effort": None, "summary": None}
    if not isinstance(value, dict) or set(value) - {"effort", "summary", "generate_summary"}:
        raise bad_field("reasoning", 'reasoning is {"effort": …, "summary": …}')
    effort = value.get("effort")
    summary = value.get("summary", value.get("generate_summary"))
    if effort is not None and effort not in (*REASONING_EFFORTS, "xhigh"):
        raise bad_field("reasoning.effort", f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}, xhigh")
    if summary not in (None, "auto", "concise", "detailed"):
        raise bad_field("reasoning.summary", "reasoning.summary must be auto, concise or detailed")
    think = None if effort is None else effort != "none"
    return think, ({"reasoning_effort": effort} if effort else {}), {"effort": effort, "summary": summary}


def _text_format(value: Any) -> Format | None:
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (flat: name, schema, strict)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"format", "verbosity"}:
        raise bad_field("text", 'text is {"format": {…}, "verbosity": …}')
    fmt = value.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise bad_field("text.format", "text.format must be an object")
    if fmt.get("type") == "json_object":
        return from_schema({"type": "object"})
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad_field("text.format", 'text.format is {"type": "text" | "json_object"} or a json_schema with a schema')
    spec = {k: v for k, v in fmt.items() if k != "type"}
    try:
        return response_format({"type": "json_schema", "json_schema": spec}, parameter="text.format")
    except InvalidParameter as exc:
        raise bad_field(exc.name, f"{exc.name} must be {exc.expected}") from None


# --- tools ---------------------------------------------------------------------------------------------

FUNCTION_KINDS = ("function", "namespace")


def _tools(
    value: Any, choice: Any, parallel: Any, names: dict[str, tuple[str, str]]
) -> tuple[ToolUse | None, list[str]]:
    """The functions the model may call (namespaces flattened into ``names``), the hosted tools left out."""
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_field("parallel_tool_calls", "parallel_tool_calls must be a boolean", "invalid_type")
    if value is None:
        value = []
    if not isinstance(value, list):
        raise bad_field("tools", "tools must be an array", "invalid_type")
    tools: list[Tool] = []
    skipped: list[str] = []
    try:
        for i, tool in enumerate(value):
            where = f"tools[{i}]"
            kind = tool.get("type") if isinstance(tool, dict) else None
            if not isinstance(kind, str):
                raise limits.OverLimit(where, 'a tool is an object with a "type"')
            if kind == "function":
                tools.append(_function(tool, where))
            elif kind == "namespace":
                space = limits.tool_name(tool.get("name"), f"{where}.name")
                inner = tool.get("tools")
                if not isinstance(inner, list):
                    raise limits.OverLimit(f"{where}.tools", "a namespace holds an array of tools")
                for j, function in enumerate(inner):
                    at = f"{where}.tools[{j}]"
                    if not isinstance(function, dict) or function.get("type") != "function":
                        skipped.append(f"{space}.{function.get('name') if isinstance(function, dict) else j}")
                        continue
                    made = _function(function, at)
                    flat = limits.tool_name(f"{space}{SEPARATOR}{made.name}", f"{at}.name")
                    names[flat] = (space, made.name)
                    tools.append(dataclasses.replace(made, name=flat))
            else:  # hosted (web_search, file_search, code_interpreter, …) or custom: not run here
                skipped.append(str(tool.get("name") or kind))
        if tools:
            limits.tool_count(len(tools))
            limits.tool_names([t.name for t in tools])
    except limits.OverLimit as exc:
        raise over_limit(exc) from None
    if not tools:
        if choice not in (None, "auto", "none"):
            raise bad_field("tool_choice", "tool_choice needs function tools")
        return None, skipped
    return _choice(tuple(tools), choice, parallel is not False, names), skipped


def _function(tool: dict[str, Any], where: str) -> Tool:
    name = limits.tool_name(tool.get("name"), f"{where}.name")
    description = tool.get("description") or ""
    if not isinstance(description, str):
        raise limits.OverLimit(f"{where}.description", "description must be a string")
    parameters = tool.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise limits.OverLimit(f"{where}.parameters", "parameters must be a JSON Schema object")
    text = json.dumps(parameters, ensure_ascii=False)
    limits.schema_size(text, f"{where}.parameters")
    return Tool(name, description, text)


def _choice(tools: tuple[Tool, ...], choice: Any, parallel: bool, names: dict[str, tuple[str, str]]) -> ToolUse:
    if choice in (None, "auto"):
        return ToolUse(tools, "auto", parallel=parallel)
    if choice in ("none", "required"):
        return ToolUse(tools, choice, parallel=parallel)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        flat: dict[tuple[Any, Any], str] = {v: k for k, v in names.items()}
        name = flat.get((choice.get("namespace"), choice["name"]), choice["name"])
        if name not in {t.name for t in tools}:
            raise bad_field("tool_choice.name", f"tool_choice names {choice['name']!r}, which is not among the tools")
        return ToolUse(tools, "function", name, parallel=parallel)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        return _allowed(tools, choice, parallel, names)
    raise bad_field("tool_choice", 'tool_choice must be auto, none, required or {"type": "function", "name": …}')


def _allowed(
    tools: tuple[Tool, ...], choice: dict[str, Any], parallel: bool, names: dict[str, tuple[str, str]]
) -> ToolUse:
    """``allowed_tools``: the model offered only the functions listed (``mode``: auto or required)."""
    listed = choice.get("tools")
    mode = choice.get("mode", "auto")
    if not isinstance(listed, list) or mode not in ("auto", "required"):
        raise bad_field(
            "tool_choice", 'allowed_tools is {"type": "allowed_tools", "mode", "tools": [{"type": "function", "name"}]}'
        )
    flat: dict[tuple[Any, Any], str] = {v: k for k, v in names.items()}
    wanted = {flat.get((t.get("namespace"), t.get("name")), t.get("name")) for t in listed if isinstance(t, dict)}
    kept = tuple(t for t in tools if t.name in wanted)
    if not kept:
        raise bad_field("tool_choice.tools", "allowed_tools names none of the tools")
    return ToolUse(kept, mode, parallel=parallel)


# --- answers -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class OutputIds:
    """The ids of one answer's output items (a stream names them before the answer is whole)."""

    reasoning: str = dataclasses.field(default_factory=lambda: new_id("rs_"))
    message: str = dataclasses.field(default_factory=lambda: new_id("msg_"))
    calls: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (item id, call id) in order

    def call(self, index: int) -> tuple[str, str]:
        while len(self.calls) <= index:
            self.calls.append((new_id("fc_"), new_id("call_")))
        return self.calls[index]


def answer_text(result: Result) -> str:
    return (result.content or "") if result.content is not None or result.tool_calls else result.text


def function_call(
    call: ToolCall, ids: tuple[str, str], names: dict[str, tuple[str, str]], status: str
) -> dict[str, Any]:
    space, name = names.get(call.name, (None, call.name))
    item = {"type": "function_call", "id": ids[0], "call_id": ids[1], "name": name, "arguments": call.arguments}
    return {**item, **({"namespace": space} if space else {}), "status": status}


def message_item(ident: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": ident, "status": status, "role": "assistant", "content": [part]}


def reasoning_item(ident: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": ident, "summary": [{"type": "summary_text", "text": text}]}


def output_items(result: Result, ids: OutputIds, names: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    status = "incomplete" if result.finish_reason in INCOMPLETE else "completed"
    items: list[dict[str, Any]] = []
    if result.reasoning:
        items.append(reasoning_item(ids.reasoning, result.reasoning))
    text = answer_text(result)
    if text or not result.tool_calls:
        items.append(message_item(ids.message, text, status))
    items += [function_call(c, ids.call(i), names, "completed") for i, c in enumerate(result.tool_calls)]
    return items


def usage(result: Result) -> dict[str, Any]:
    reasoning = result.generated_tokens if result.reasoning and not answer_text(result) else 0
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_tokens},
        "output_tokens": result.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": result.prompt_tokens + result.generated_tokens,
    }


def response_body(
    ident: str,
    model: str,
    call: ResponsesCall,
    created: float,
    result: Result | None = None,
    output: list[dict[str, Any]] | None = None,
    status: str = "in_progress",
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Response object: in progress (no result yet), completed or incomplete (``result``), or failed."""
    incomplete = None
    if result is not None:
        status = "incomplete" if result.finish_reason in INCOMPLETE else "completed"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": ident,
        "object": "response",
        "created_at": int(created),
        "status": status,
        "completed_at": int(time.time()) if result is not None else None,
        "error": error,
        "incomplete_details": incomplete,
        "model": model,
        "output": output or [],
        **call.echo,
        "usage": usage(result) if result is not None else None,
    }


def stored(body: dict[str, Any], call: ResponsesCall, earlier: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """What is kept of a stored response: the Response, its input items, and the whole conversation (the
    earlier responses' items, this input, this output) that a later ``previous_response_id`` continues."""
    return {
        "response": body,
        "input_items": list(call.items),
        "conversation": [*earlier, *call.items, *body["output"]],
    }
