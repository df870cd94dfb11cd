"""A request, as every adapter builds it, and the prompt tokens it stands for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmrun.errors import InvalidParameter
from llmrun.pipeline import PromptFormat, chat_template, conversation_ids, prompt_ids
from llmrun.sampling import SamplingParams
from llmrun.structured.formats import Format
from llmrun.template import Message

if TYPE_CHECKING:
    from llmrun.backends.base import LoadedModel
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

    def __post_init__(self) -> None:
        if (self.prompt is None) == (not self.messages):
            raise InvalidParameter("prompt", self.prompt, "given alone, or messages instead (not both, not neither)")
        if isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int):
            raise InvalidParameter("logprobs", self.logprobs, f"an integer from 0 to {MAX_LOGPROBS}")
        if not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidParameter("logprobs", self.logprobs, f"an integer from 0 to {MAX_LOGPROBS}")


@dataclass(frozen=True, slots=True)
class Templates:
    """The model's own chat template (None: plain prompts), and the one conversations use
    (its own, else the built-in for its architecture), with where that came from."""

    own: str | None
    conversation: str
    conversation_source: str


def choose_template(run_plan: RunPlan, name: str | None = None) -> Templates:
    """``name`` (a built-in template), else the model's own, else the built-in for its architecture."""
    from llmrun.template import BUILTIN_TEMPLATES, builtin_for

    own = chat_template(run_plan)
    if name:
        return Templates(own, BUILTIN_TEMPLATES[name], name)
    if own:
        return Templates(own, own, "the model's own")
    fallback = builtin_for(run_plan.header.architecture)
    return Templates(own, BUILTIN_TEMPLATES[fallback], f"{fallback} (built in; the model has none)")


def request_constraint(model: LoadedModel, request: Request) -> Constraint | None:
    """The grammar state the request's answer is decoded under (None: unconstrained); a format the
    decoder cannot enforce fails here, before anything runs."""
    if request.response_format is None:
        return None
    from llmrun.structured.grammar import constraint_for

    return constraint_for(model, request.response_format)


def request_ids(model: LoadedModel, templates: Templates, request: Request) -> tuple[list[int], PromptFormat]:
    """The request's prompt tokens; user text is never read as special tokens."""
    if request.prompt is not None:
        return prompt_ids(model, templates.own, request.prompt, request.system, request.raw)
    head = [Message("system", request.system)] if request.system else []
    return conversation_ids(model, templates.conversation, [*head, *request.messages]), "chat template"
