"""A request, as every adapter builds it, and the prompt tokens it stands for."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmrun.decoding.reasoning import Thinking, split, thinking_for
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.result import Result, TokenLogprob
from llmrun.errors import InvalidParameter, UsageError
from llmrun.prompt.render import Prompt, PromptFormat, prompt_ids, render_prompt
from llmrun.prompt.template import Message
from llmrun.structured.dialects import Dialect, dialect_for
from llmrun.structured.formats import Format
from llmrun.structured.generic import generic_messages
from llmrun.structured.tools import ToolUse, named_results, reasoning_first, uses_tools

if TYPE_CHECKING:
    from llmrun.backends.base import LoadedModel
    from llmrun.decoding.events import Done
    from llmrun.engine.plan import RunPlan
    from llmrun.formats.gguf_header import GgufHeader
    from llmrun.models.registry import ModelEntry
    from llmrun.structured.grammar import Constraint

MAX_LOGPROBS = 100


@dataclass(frozen=True, slots=True)
class Request:
    """A prompt (plain text, through the model's template unless ``raw``) or a conversation."""

    prompt: str | None = None
    messages: tuple[Message, ...] = ()
    params: SamplingParams = field(default_factory=SamplingParams)
    system: str | None = None
    raw: bool = False  # a prompt as plain text even when the model has a chat template
    logprobs: int = 0  # each token's log-probability and this many alternatives
    response_format: Format | None = None  # constrain the answer to JSON, a JSON Schema or a grammar
    tools: ToolUse | None = None  # functions the model may (or must) call
    think: bool | None = None  # a reasoning model's enable_thinking (None: the template's default)
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # more variables for the chat template
    continue_final: bool = False  # the answer continues the last (assistant) message instead of a new turn
    images: tuple[bytes, ...] = ()  # image files' bytes, before the prompt's text (or the last user message's)

    @property
    def has_images(self) -> bool:
        return bool(self.images) or any(m.images for m in self.messages)

    @property
    def variables(self) -> dict[str, Any]:
        """The extra variables the chat template is rendered with."""
        extra = {"enable_thinking": self.think} if self.think is not None else {}
        return {**self.template_kwargs, **extra}

    def __post_init__(self) -> None:
        if (self.prompt is None) == (not self.messages):
            raise InvalidParameter("prompt", self.prompt, "given alone, or messages instead (not both, not neither)")
        if isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int):
            raise InvalidParameter("logprobs", self.logprobs, f"an integer from 0 to {MAX_LOGPROBS}")
        if not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidParameter("logprobs", self.logprobs, f"an integer from 0 to {MAX_LOGPROBS}")
        if self.tools is not None and not self.messages:
            raise InvalidParameter("tools", "given", "given with messages (a conversation), not a plain prompt")
        if self.continue_final and (not self.messages or self.messages[-1].role != "assistant"):
            raise InvalidParameter(
                "continue_final_message", True, "false unless the conversation's last message is the assistant's"
            )


@dataclass(frozen=True, slots=True)
class Templates:
    """The chat template prompts go through (None: plain prompts), and the one conversations use
    (the same, else the built-in for the model's architecture), with where that came from."""

    own: str | None
    conversation: str
    conversation_source: str
    system: str | None = None  # the system prompt the model's store keeps with it (Ollama's SYSTEM)
    tool_use: str | None = None  # the model's own template for requests with tools, when it has one

    def for_request(self, request: Request) -> str:
        """The template a conversation goes through: the model's ``tool_use`` template when the
        request offers tools and the model has one (as transformers chooses), else ``conversation``."""
        return self.tool_use if request.tools is not None and self.tool_use else self.conversation

    @property
    def prompt_source(self) -> str:
        """Where a plain prompt's template came from ('none': the prompt goes as plain text)."""
        return self.conversation_source if self.own is not None else "none"


def choose_template(run_plan: RunPlan, chosen: tuple[str, str] | None = None) -> Templates:
    """The templates a run's requests go through (see :func:`templates_for`); a remote engine's are its own."""
    if run_plan.backend == "remote":
        return Templates("", "", "the endpoint's own")
    return templates_for(run_plan.model.entry, run_plan.header, run_plan.system, chosen)


def templates_for(
    entry: ModelEntry | None, header: GgufHeader, system: str | None = None, chosen: tuple[str, str] | None = None
) -> Templates:
    """``chosen`` (a template and where it came from: ``--template``, built in or a file), else the
    model's own (models.toml's, then the model file's), else the built-in for its architecture."""
    from llmrun.prompt.template import BUILTIN_TEMPLATES, builtin_for

    if chosen is not None:
        return Templates(chosen[0], chosen[0], chosen[1], system)
    if entry and entry.template:
        return Templates(
            entry.template, entry.template, "the model's own (models.toml)", system, header.tool_use_template
        )
    own = header.chat_template
    if own:
        return Templates(own, own, "the model's own (embedded)", system, header.tool_use_template)
    fallback = builtin_for(header.architecture)
    return Templates(own, BUILTIN_TEMPLATES[fallback], f"{fallback} (built in; the model has none)", system)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request's prompt as the model reads it, and how its answer's reasoning is told apart."""

    prompt: Prompt
    format: PromptFormat
    thinking: Thinking | None = None  # None: the template has no reasoning markers (or a plain prompt)
    images: tuple[bytes, ...] = ()  # the images in the prompt, in order (``prompt.images`` says where each sits)

    @property
    def ids(self) -> list[int]:
        return self.prompt.ids


def tool_dialect(templates: Templates, request: Request) -> Dialect | None:
    """How the model writes the request's tool calls (None: the request offers no tools)."""
    return dialect_for(templates.for_request(request)) if request.tools is not None else None


def request_constraint(
    model: LoadedModel, templates: Templates, request: Request, prepared: Prepared
) -> Constraint | None:
    """The grammar state the request's answer is decoded under (None: unconstrained): its format, or
    the calls its tools allow (after a reasoning model's reasoning); a format the decoder cannot enforce
    fails here, before anything runs."""
    from llmrun.structured.grammar import constraint_for, marker_for

    fmt = request.response_format
    dialect = tool_dialect(templates, request)
    if dialect is not None and request.tools is not None:
        marker = marker_for(model)
        fmt = dialect.format(request.tools, marker, request.response_format)
        thinking = prepared.thinking
        if thinking is not None:
            opens = None if thinking.started else thinking.markers.open
            fmt = reasoning_first(fmt, thinking.markers.close, marker, opens)
    return constraint_for(model, fmt) if fmt is not None else None


def request_result(result: Result, templates: Templates, request: Request, prepared: Prepared) -> Result:
    """The result with a reasoning model's reasoning apart from its answer, and its tool calls read
    out of the answer (when the request offered tools)."""
    if prepared.thinking is not None:
        reasoning, answer = split(prepared.thinking, result.text)
        result = dataclasses.replace(result, text=answer, reasoning=reasoning)
    dialect = tool_dialect(templates, request)
    if dialect is None or request.tools is None:
        return result
    content, calls = dialect.parse(result.text, request.tools.tools)
    if request.tools.mode == "none":  # no call was allowed; what looks like one is text
        content, calls = (content if not dialect.native else result.text), ()
    return dataclasses.replace(result, content=content, tool_calls=calls)


def finish(
    done: Done,
    templates: Templates,
    request: Request,
    prepared: Prepared,
    logprobs: tuple[TokenLogprob, ...] | None = None,
) -> Result:
    """A finished answer as the request's Result (reasoning apart, tool calls read out), wherever it ran:
    the single stream, the batch of ``complete_many`` or the server's scheduler."""
    result = Result.of(done, prepared.format, logprobs, request.response_format)
    return request_result(result, templates, request, prepared)


def image_marker() -> str:
    """Where an image goes in a rendered prompt: chosen at random per request, so user text cannot forge one."""
    import secrets

    return f"<__llmrun_image_{secrets.token_hex(8)}__>"


def request_ids(model: LoadedModel, templates: Templates, request: Request) -> Prepared:
    """The request's prompt; user text is never read as special tokens. Images go before the text (as
    llama.cpp's mtmd-cli and Ollama put them): ``Prepared.prompt.images`` says where."""
    system = request.system if request.system is not None else templates.system  # the model's, unless given
    marker = image_marker() if request.has_images else None
    images = (marker or "") * len(request.images)
    if request.prompt is not None:
        prompt, fmt = prompt_ids(
            model,
            templates.own,
            images + request.prompt,
            request.system if request.raw else system,
            request.raw,
            request.variables,
            image_marker=marker,
        )
        template = templates.own if fmt == "chat template" else None
        thinking = thinking_for(template, prompt.text) if template else None
        return _nonempty(Prepared(prompt, fmt, thinking, request.images))
    if any(m.role == "system" for m in request.messages):
        system = request.system
    head = [Message("system", system)] if system else []
    messages = [*head, *request.messages]
    if images:
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            raise UsageError("images go with a user message, and the conversation has none", "add one")
        last = users[-1]
        messages[last] = dataclasses.replace(messages[last], images=messages[last].images + request.images)
    in_order: tuple[bytes, ...] = ()
    for number, message in enumerate(messages):
        if message.images:
            if message.role != "user":
                raise UsageError(f"images go with user messages, not {message.role} ones", "")
            in_order += message.images
            messages[number] = dataclasses.replace(
                message, content=(marker or "") * len(message.images) + message.content
            )
    dialect = tool_dialect(templates, request)
    tools = None
    if dialect is None or request.tools is None:
        if uses_tools(messages) and not dialect_for(templates.conversation).native:
            messages = generic_messages(messages, None)  # earlier calls and results, as such a model reads them
        elif uses_tools(messages):
            messages = named_results(messages)
    elif dialect.native:
        tools = [t.openai() for t in request.tools.tools]
        messages = named_results(messages)
    else:
        messages = generic_messages(messages, request.tools)
    template = templates.for_request(request)
    prompt = render_prompt(
        model,
        template,
        messages,
        tools=tools,
        variables=request.variables,
        continue_final=request.continue_final,
        image_marker=marker,
    )
    return _nonempty(Prepared(prompt, "chat template", thinking_for(template, prompt.text), in_order))


def _nonempty(prepared: Prepared) -> Prepared:
    if not prepared.ids:  # nothing to evaluate: llama.cpp cannot decode an empty batch
        raise UsageError("the prompt is empty (it has no tokens)", "send some text")
    return prepared
