"""The OpenAI API on the wire (pure): a :class:`Request` as a request body, streamed chunks as events,
and the finished answer as the engine's one :class:`Result`.

Standard fields always go (``temperature``, ``top_p``, ``max_tokens``, …), and so do the sampling
settings the OpenAI API lacks (``top_k``, ``min_p``, ``repeat_penalty``, ``repeat_last_n``), under the
names vLLM and llama-server read, so an answer there is the answer llmrun gives locally (llama-cpp-python's
server would otherwise apply its own repeat penalty of 1.1). A strict endpoint that rejects one the user
did not set is asked again without them (:class:`~llmrun.remote.model.RemoteModel`); one the user set
is one line naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llmrun.decoding.events import Candidate, Token
from llmrun.errors import UsageError
from llmrun.prompt.template import Message, ToolCall, message_dict
from llmrun.structured.formats import conforms

if TYPE_CHECKING:
    from llmrun.decoding.events import FinishReason
    from llmrun.engine.request import Request
    from llmrun.engine.result import Result, TokenLogprob
    from llmrun.structured.formats import Format

Route = Literal["/chat/completions", "/completions"]

# our field → the names engines read it by (vLLM: repetition_penalty; llama-server: repeat_penalty)
EXTRA_FIELDS: dict[str, tuple[str, ...]] = {
    "top_k": ("top_k",),
    "min_p": ("min_p",),
    "repeat_penalty": ("repeat_penalty", "repetition_penalty"),
    "repeat_last_n": ("repeat_last_n",),
}
FINISH: dict[str, FinishReason] = {"stop": "eos", "length": "length", "tool_calls": "eos", "content_filter": "stop"}


def route(request: Request) -> Route:
    """A raw prompt goes to the completions API as plain text; everything else is a conversation
    (the endpoint renders it through the model's own chat template)."""
    return "/completions" if request.prompt is not None and request.raw else "/chat/completions"


def body(request: Request, model: str, *, extras: frozenset[str] = frozenset(), stream: bool = True) -> dict[str, Any]:
    """The request as the endpoint's JSON body. ``extras``: the non-OpenAI settings to send."""
    p = request.params
    data: dict[str, Any] = {"model": model, "temperature": p.temperature, "top_p": p.top_p}
    if p.max_tokens > 0:
        data["max_tokens"] = p.max_tokens
    if p.seed is not None:
        data["seed"] = p.seed
    if p.stop:
        data["stop"] = list(p.stop)
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(p, name):
            data[name] = getattr(p, name)
    for name in sorted(extras & EXTRA_FIELDS.keys()):
        for wire_name in EXTRA_FIELDS[name]:
            data[wire_name] = getattr(p, name)
    if stream:
        data["stream"] = True
        data["stream_options"] = {"include_usage": True}
    if request.logprobs and route(request) == "/completions":
        data["logprobs"] = request.logprobs  # (the legacy API: the number of alternatives)
    elif request.logprobs:
        data["logprobs"], data["top_logprobs"] = True, request.logprobs
    if route(request) == "/completions":
        assert request.prompt is not None
        data["prompt"] = f"{request.system}\n\n{request.prompt}" if request.system else request.prompt
        return {**data, **_format_fields(request.response_format)}
    data["messages"] = [_message(m) for m in messages(request)]
    data.update(_format_fields(request.response_format))
    variables = request.variables
    if variables:
        data["chat_template_kwargs"] = variables
    if request.tools is not None:
        use = request.tools
        data["tools"] = [t.openai() for t in use.tools]
        data["tool_choice"] = (
            {"type": "function", "function": {"name": use.function}} if use.mode == "function" else use.mode
        )
        data["parallel_tool_calls"] = use.parallel
    return data


def messages(request: Request) -> list[Message]:
    """The conversation the endpoint gets: the system prompt first (unless the messages carry one)."""
    if request.prompt is not None:
        head = [Message("system", request.system)] if request.system else []
        return [*head, Message("user", request.prompt)]
    has_system = any(m.role == "system" for m in request.messages)
    head = [Message("system", request.system)] if request.system and not has_system else []
    return [*head, *request.messages]


def _message(message: Message) -> dict[str, Any]:
    data = message_dict(message)
    data.pop("thinking", None)
    for call in data.get("tool_calls", ()):  # the API sends arguments as JSON text
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=False)
    return data


def _format_fields(fmt: Format | None) -> dict[str, Any]:
    if fmt is None:
        return {}
    if fmt.kind == "json":
        return {"response_format": {"type": "json_object"}}
    if fmt.kind == "schema":
        schema = {"name": fmt.name or "answer", "schema": fmt.schema(), "strict": True}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    if fmt.kind == "gbnf":
        return {"grammar": fmt.text}  # llama-server's and llama-cpp-python's field
    raise UsageError("a Lark grammar cannot be sent to a remote engine", "use a JSON Schema, or a GBNF grammar")


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reported: bool = False  # the endpoint sent usage (else the counts are chunks seen)


@dataclass
class Assembly:
    """A streamed answer being put together: each chunk's text becomes a :class:`Token`, the tool-call
    fragments are joined, and the finish reason and usage are kept for the :class:`Result`."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish: str | None = None
    usage: Usage = field(default_factory=Usage)
    pieces: int = 0  # chunks that carried text: a token each on llama.cpp, vLLM and llmrun
    logprobs: list[TokenLogprob] = field(default_factory=list)  # what the endpoint reported, token by token

    def chunk(self, data: Any) -> Token | None:
        """One streamed chunk (a parsed ``data:`` line); the token it carries, if any."""
        if not isinstance(data, dict):
            return None
        self._usage(data.get("usage"))
        choices = data.get("choices") or []
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else None
        if delta is None:  # the completions API
            text, thought = _text(choice.get("text")), ""
        else:
            text = _text(delta.get("content"))
            thought = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
            for call in delta.get("tool_calls") or []:
                self._call(call)
        entries = token_logprobs(choice.get("logprobs"))
        self.logprobs += entries
        if not text and not thought:
            return None
        self.pieces += 1
        self.text.append(text)
        self.reasoning.append(thought)
        if len(entries) == 1:  # a chunk per token (llama.cpp, vLLM, llmrun): its probability with it
            return Token(-1, text, entries[0].logprob, entries[0].top, reasoning=thought)
        return Token(-1, text, reasoning=thought)

    def whole(self, data: Any) -> None:
        """A whole (not streamed) answer."""
        if not isinstance(data, dict):
            return
        self._usage(data.get("usage"))
        choices = data.get("choices") or []
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        self.finish = str(choice.get("finish_reason") or "stop")
        self.logprobs += token_logprobs(choice.get("logprobs"))
        message = choice.get("message") if isinstance(choice.get("message"), dict) else None
        if message is None:
            self.text.append(_text(choice.get("text")))
        else:
            self.text.append(_text(message.get("content")))
            self.reasoning.append(_text(message.get("reasoning_content")) or _text(message.get("reasoning")))
            for index, call in enumerate(message.get("tool_calls") or []):
                if isinstance(call, dict):
                    self._call({**call, "index": index})
        self.pieces = 1 if "".join(self.text) else 0

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.usage.reported = True
        self.usage.prompt_tokens = _count(usage.get("prompt_tokens"))
        self.usage.completion_tokens = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            self.usage.cached_tokens = _count(details.get("cached_tokens"))

    def _call(self, call: Any) -> None:
        if not isinstance(call, dict):
            return
        index = call.get("index", 0) if isinstance(call.get("index"), int) else 0
        entry = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        entry["name"] += _text(function.get("name"))
        entry["arguments"] += _text(function.get("arguments"))

    @property
    def answer(self) -> str:
        return "".join(self.text)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(c["id"] or f"call_{i}", c["name"], c["arguments"] or "{}") for i, c in sorted(self.calls.items())
        )

    def result(self, request: Request, first: float | None, last: float, started: float) -> Result:
        """The engine's result: counts from the endpoint's ``usage`` (else the chunks seen), times
        measured here (``first``/``last``: when the first and last token arrived)."""
        from llmrun.engine.result import Result

        generated = self.usage.completion_tokens if self.usage.reported else self.pieces
        ttft = (first if first is not None else last) - started
        decode = last - first if first is not None else 0.0
        reasoning = "".join(self.reasoning)
        fmt = request.response_format
        calls = self.tool_calls
        return Result(
            text=self.answer,
            prompt_tokens=self.usage.prompt_tokens,
            generated_tokens=generated,
            finish_reason=FINISH.get(self.finish or "stop", "eos"),
            stop_string=None,
            seed=request.params.seed if request.params.temperature > 0 else None,
            time_to_first_token_s=ttft,
            prompt_tokens_per_s=self.usage.prompt_tokens / ttft if ttft > 0 else 0.0,
            generation_tokens_per_s=(generated - 1) / decode if generated > 1 and decode > 0 else 0.0,
            prompt_format="plain" if route(request) == "/completions" else "chat template",
            cached_tokens=self.usage.cached_tokens,
            structured=fmt.kind if fmt is not None else None,
            valid=_whole(self.answer, fmt, self.finish) if fmt is not None else None,
            content=self.answer if not calls else (self.answer or None),
            tool_calls=calls,
            reasoning=reasoning or None,
            logprobs=tuple(self.logprobs) if request.logprobs else None,
        )


def token_logprobs(data: Any) -> list[TokenLogprob]:
    """A choice's ``logprobs`` as entries: the chat API's ``content`` list, or the completions API's
    parallel lists. What an endpoint leaves out (or sends malformed) is left out; ids are unknown (-1)."""
    from llmrun.engine.result import TokenLogprob

    if not isinstance(data, dict):
        return []
    if isinstance(data.get("content"), list):
        entries = []
        for item in data["content"]:
            if isinstance(item, dict) and _is_number(item.get("logprob")):
                top = [
                    c for c in item.get("top_logprobs") or [] if isinstance(c, dict) and _is_number(c.get("logprob"))
                ]
                alternatives = tuple(Candidate(-1, _piece(c), float(c["logprob"])) for c in top)
                entries.append(TokenLogprob(-1, _piece(item), float(item["logprob"]), alternatives))
        return entries
    tokens, values, tops = data.get("tokens"), data.get("token_logprobs"), data.get("top_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return []
    tops = tops if isinstance(tops, list) else []
    entries = []
    for i, (token, value) in enumerate(zip(tokens, values, strict=False)):
        if isinstance(token, str) and _is_number(value):
            top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
            alternatives = tuple(Candidate(-1, str(t).encode(), float(lp)) for t, lp in top.items() if _is_number(lp))
            entries.append(TokenLogprob(-1, token.encode(), float(value), alternatives))
    return entries


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _piece(item: dict[str, Any]) -> bytes:
    """A token's bytes: the ``bytes`` list when the endpoint sends it (a token may be part of a character)."""
    raw = item.get("bytes")
    if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        return bytes(raw)
    return _text(item.get("token")).encode()


def _whole(text: str, fmt: Format, finish: str | None) -> bool:
    """Whether a constrained answer came out whole (the endpoint enforced the format)."""
    if finish == "length":
        return False
    return not fmt.is_json or conforms(fmt, text)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def served_models(data: Any) -> list[str]:
    """The model ids a ``/models`` answer lists (OpenAI's ``{"data": [{"id"}]}``, Ollama's ``models``)."""
    if not isinstance(data, dict):
        return []
    rows = data.get("data") if isinstance(data.get("data"), list) else data.get("models")
    ids = [row.get("id") or row.get("name") or row.get("model") for row in rows or [] if isinstance(row, dict)]
    return [i for i in ids if isinstance(i, str)]


def error_message(data: Any, fallback: str) -> str:
    """The message of an error body: OpenAI's ``{"error": {"message"}}``, FastAPI's ``detail``, or text."""
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        detail = data.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            loc = ".".join(str(x) for x in detail[0].get("loc", ()) if x != "body")
            return f"{loc}: {detail[0].get('msg', '')}".strip(": ")
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return fallback
