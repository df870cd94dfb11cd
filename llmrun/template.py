"""Chat templates: the model's Jinja2 template rendered in an immutable sandbox.

:func:`render` returns the prompt as :class:`Segment` s so that only the
template's own text may become special tokens: message contents are rendered
through placeholders and come back marked ``special=False``, so a user who types
``<start_of_turn>`` or ``<|im_start|>system`` cannot forge a turn.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmrun.errors import TemplateError

MAX_OUTPUT_CHARS = 1_000_000
MAX_RENDER_SECONDS = 2.0
PLAIN_PROMPT = "pass the prompt as plain text (`raw`)"  # the hint for a template that cannot be used


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the model made: ``arguments`` is JSON text (an object), as OpenAI sends it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers
    name: str | None = None  # a tool turn: the function's name


def message_dict(message: Message, content: str) -> dict[str, Any]:
    """A message as chat templates read it (Hugging Face's shape): calls' arguments as objects, which
    templates serialize themselves (``tool_call.function.arguments | tojson``)."""
    data: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        data["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        data["name"] = message.name
    return data


def _arguments(text: str) -> Any:
    import json

    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


@dataclass(frozen=True, slots=True)
class Segment:
    text: str
    special: bool  # may this text contain special tokens (template text) or not (content)


_BLOCKED_ATTRIBUTES = frozenset({"format", "format_map", "mro", "func_globals", "gi_frame", "cr_frame"})


def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Sandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox, minus str.format (a known route around it)."""

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            if attr in _BLOCKED_ATTRIBUTES:
                return False
            return bool(super().is_safe_attribute(obj, attr, value))

        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            from jinja2.exceptions import SecurityError

            raise SecurityError(f"access to {attribute!r} of a {type(obj).__name__} is not allowed")

        def getattr(self, obj: Any, attribute: str) -> Any:
            if attribute in _BLOCKED_ATTRIBUTES:
                return self.unsafe_undefined(obj, attribute)
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            if isinstance(argument, str) and argument in _BLOCKED_ATTRIBUTES and not isinstance(obj, dict):
                return self.unsafe_undefined(obj, argument)
            return super().getitem(obj, argument)

    def raise_exception(message: str) -> None:
        raise TemplateError(f"the chat template refused the conversation: {message}", "check the messages")

    def strftime_now(fmt: str) -> str:
        return time.strftime(fmt)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env


def render_text(
    template: str,
    messages: Sequence[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: Sequence[dict[str, Any]] | None = None,
    contents: Sequence[str] | None = None,
) -> str:
    """Render ``template`` with the usual Hugging Face variables (``tools`` as OpenAI's tool objects,
    None when there are none), within size and time limits; ``contents`` replace the messages' texts."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.exceptions import SecurityError

    try:
        compiled = _environment().from_string(template)
        started = time.monotonic()
        out: list[str] = []
        size = 0
        texts = contents if contents is not None else [m.content for m in messages]
        for chunk in compiled.generate(
            messages=[message_dict(m, text) for m, text in zip(messages, texts, strict=True)],
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
            tools=list(tools) if tools else None,
        ):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise TemplateError(
                    f"the chat template produced more than {MAX_OUTPUT_CHARS:,} characters",
                    "the template is broken or hostile; " + PLAIN_PROMPT,
                )
            if time.monotonic() - started > MAX_RENDER_SECONDS:
                raise TemplateError(
                    f"the chat template took more than {MAX_RENDER_SECONDS:.0f} s to render",
                    "the template is broken or hostile; " + PLAIN_PROMPT,
                )
            out.append(chunk)
        return "".join(out)
    except TemplateError:
        raise
    except SecurityError as exc:
        raise TemplateError(f"the chat template tried something unsafe: {exc}", PLAIN_PROMPT) from exc
    except (JinjaError, TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise TemplateError(f"the chat template failed to render: {exc}", PLAIN_PROMPT) from exc
    except (RecursionError, OverflowError, MemoryError) as exc:
        raise TemplateError(f"the chat template failed to render: {type(exc).__name__}", PLAIN_PROMPT) from exc


def render(
    template: str,
    messages: Sequence[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[Segment]:
    """The rendered prompt as segments; message contents are never special."""
    nonce = f"{secrets.randbelow(10**16):016d}"  # digits: survive upper/lower/trim
    placeholders = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
    text = render_text(
        template,
        messages,
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        contents=placeholders,
    )
    pattern = re.compile("\ue000" + nonce + r":(\d+)\ue001")
    segments: list[Segment] = []
    position = 0
    for match in pattern.finditer(text):
        if match.start() > position:
            segments.append(Segment(text[position : match.start()], True))
        segments.append(Segment(messages[int(match.group(1))].content, False))
        position = match.end()
    if position < len(text):
        segments.append(Segment(text[position:], True))
    if any("\ue000" + nonce in s.text for s in segments if s.special):
        raise TemplateError("the chat template altered message contents", PLAIN_PROMPT)
    return segments


# --- built-in templates ----------------------------------------------------------
# For models whose GGUF carries no chat template (base models, old conversions), or when
# the user names one with --template. Each renders the usual Hugging Face variables.

_SYSTEM_INTO_FIRST_USER = (
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "gemma": (
        "{{ bos_token }}" + _SYSTEM_INTO_FIRST_USER + "{% for m in turns %}"
        "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
        "{{ (system if loop.first else '') + m['content'] }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "mistral": (
        "{{ bos_token }}" + _SYSTEM_INTO_FIRST_USER + "{% for m in turns %}"
        "{% if m['role'] == 'user' %}[INST] {{ (system if loop.first else '') + m['content'] }} [/INST]"
        "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    ),
    "phi3": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    "raw": "{% for m in messages %}{{ m['content'] }}\n\n{% endfor %}",
}

_BY_ARCHITECTURE = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "llama": "llama3",
    "qwen2": "chatml",
    "qwen3": "chatml",
    "qwen2moe": "chatml",
    "qwen3moe": "chatml",
    "phi3": "phi3",
    "mistral": "mistral",
}


def builtin_for(architecture: str) -> str:
    """The built-in template name for a model architecture (ChatML when unknown)."""
    return _BY_ARCHITECTURE.get(architecture, "chatml")
