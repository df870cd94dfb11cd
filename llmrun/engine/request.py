"""A request, as every adapter builds it, and the prompt tokens it stands for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmrun.errors import InvalidParameter
from llmrun.pipeline import PromptFormat, chat_template, conversation_ids, prompt_ids
from llmrun.sampling import SamplingParams
from llmrun.structured.formats import Format
from llmrun.structured.tools import Dialect, ToolUse, dialect_for, generic_messages, uses_tools
from llmrun.template import Message

if TYPE_CHECKING:
    from llmrun.backends.base import LoadedModel
    from llmrun.engine.result import Result
    from llmrun.pipeline import RunPlan
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

    def __post_init__(self) -> None:
        if (self.prompt is None) == (not self.messages):
            raise InvalidParameter("prompt", self.prompt, "given alone, or messages instead (not both, not neither)")
        if isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int):
            raise InvalidParameter("logprobs", self.logprobs, f"an integer from 0 to {MAX_LOGPROBS}")
        if not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidParameter("logprobs", self.logprobs, f"an integer from 0 to {MAX_LOGPROBS}")
        if self.tools is not None and not self.messages:
            raise InvalidParameter("tools", "given", "given with messages (a conversation), not a plain prompt")


@dataclass(frozen=True, slots=True)
class Templates:
    """The model's own chat template (None: plain prompts), and the one conversations use
    (its own, else the built-in for its architecture), with where that came from."""

    own: str | None
    conversation: str
    conversation_source: str
    system: str | None = None  # the system prompt the model's store keeps with it (Ollama's SYSTEM)


def choose_template(run_plan: RunPlan, name: str | None = None) -> Templates:
    """``name`` (a built-in template), else the model's own, else the built-in for its architecture."""
    from llmrun.template import BUILTIN_TEMPLATES, builtin_for

    own, system = chat_template(run_plan), run_plan.system
    if name:
        return Templates(own, BUILTIN_TEMPLATES[name], name, system)
    if own:
        return Templates(own, own, "the model's own", system)
    fallback = builtin_for(run_plan.header.architecture)
    return Templates(own, BUILTIN_TEMPLATES[fallback], f"{fallback} (built in; the model has none)", system)


def tool_dialect(templates: Templates, request: Request) -> Dialect | None:
    """How the model writes the request's tool calls (None: the request offers no tools)."""
    return dialect_for(templates.conversation) if request.tools is not None else None


def request_constraint(model: LoadedModel, templates: Templates, request: Request) -> Constraint | None:
    """The grammar state the request's answer is decoded under (None: unconstrained): its format, or
    the calls its tools allow; a format the decoder cannot enforce fails here, before anything runs."""
    from llmrun.structured.grammar import constraint_for, marker_for

    fmt = request.response_format
    dialect = tool_dialect(templates, request)
    if dialect is not None and request.tools is not None:
        fmt = dialect.format(request.tools, marker_for(model), request.response_format)
    return constraint_for(model, fmt) if fmt is not None else None


def request_result(result: Result, templates: Templates, request: Request) -> Result:
    """The result with its tool calls read out of the text (when the request offered tools)."""
    dialect = tool_dialect(templates, request)
    if dialect is None or request.tools is None:
        return result
    content, calls = dialect.parse(result.text)
    if request.tools.mode == "none":  # no call was allowed; what looks like one is text
        content, calls = (content if not dialect.native else result.text), ()
    return dataclasses.replace(result, content=content, tool_calls=calls)


def request_ids(model: LoadedModel, templates: Templates, request: Request) -> tuple[list[int], PromptFormat]:
    """The request's prompt tokens; user text is never read as special tokens."""
    system = request.system if request.system is not None else templates.system  # the model's, unless given
    if request.prompt is not None:
        return prompt_ids(model, templates.own, request.prompt, request.system if request.raw else system, request.raw)
    if any(m.role == "system" for m in request.messages):
        system = request.system
    head = [Message("system", system)] if system else []
    messages = [*head, *request.messages]
    dialect = tool_dialect(templates, request)
    if dialect is None or request.tools is None:
        if uses_tools(messages) and not dialect_for(templates.conversation).native:
            messages = generic_messages(messages, None)  # earlier calls and results, as such a model reads them
        return conversation_ids(model, templates.conversation, messages), "chat template"
    if dialect.native:
        tools = [t.openai() for t in request.tools.tools]
        return conversation_ids(model, templates.conversation, messages, tools=tools), "chat template"
    return conversation_ids(model, templates.conversation, generic_messages(messages, request.tools)), "chat template"
