"""Chat templates: the model's Jinja2 template rendered as Hugging Face transformers renders it.

:func:`render_text` gives the text byte for byte as transformers' ``apply_chat_template``
(the same sandboxed environment: ``loopcontrols``, the ``{% generation %}`` block, its
``tojson``, ``namespace``, ``dict``, ``raise_exception``, ``strftime_now``; the same variables),
within size and time limits. Message contents go to the template as they are.

So that user text never becomes special tokens, :func:`mark` wraps the special-token
strings inside user-supplied values in private-use markers for a second rendering, and
:func:`attribute` splits the real rendering into the template's own text (whose special
tokens count) and the strings users wrote (plain text), by aligning the two renderings.
The prompt is always the real rendering; the marks only say who wrote what.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from llmrun.errors import TemplateError

MAX_OUTPUT_CHARS = 1_000_000  # the template's own text, beyond twice the messages' (which api/limits.py bounds)
MAX_RENDER_SECONDS = 2.0
PLAIN_PROMPT = "pass the prompt as plain text (`raw`)"  # the hint for a template that cannot be used
MARK_START, MARK_END = "\U000f1000", "\U000f1001"  # private use: around a special-token string in user text
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' own, for continue_final_message


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
    reasoning: str | None = None  # an assistant turn's reasoning, apart from its answer
    images: tuple[bytes, ...] = ()  # a user turn's images (files' bytes), read before its text


def message_dict(message: Message) -> dict[str, Any]:
    """A message as chat templates read it (Hugging Face's shape): calls' arguments as objects, which
    templates serialize themselves (``tool_call.function.arguments | tojson``); reasoning under the
    names templates read it by (``reasoning_content``, and ``thinking`` for gpt-oss)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        data["name"] = message.name
    if message.reasoning is not None:  # transformers' _alias_reasoning_fields, in its key order
        data = {"thinking": message.reasoning, **data, "reasoning_content": message.reasoning}
    return data


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


@dataclass(frozen=True, slots=True)
class Segment:
    text: str
    special: bool  # may this text contain special tokens (template text) or not (a marked user string)


# the variables llmrun itself gives every template (extra ones may not replace them)
OWN_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})


@dataclass(frozen=True, slots=True)
class Context:
    """What a template is rendered with, besides the messages: transformers' variables."""

    bos_token: str = ""
    eos_token: str = ""
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # end the prompt inside the last message (no end-of-turn)
    tools: tuple[Mapping[str, Any], ...] | None = None  # OpenAI tool objects; None when there are none
    documents: tuple[Mapping[str, Any], ...] | None = None
    variables: Mapping[str, Any] = field(default_factory=dict)  # extra keywords, e.g. enable_thinking

    def values(self, messages: Sequence[Message], transform: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        """The template's variables; ``transform`` rewrites those that come from users (see :func:`mark`)."""
        given = self.user_values(messages)
        if transform is not None:
            given = {key: transform(value) for key, value in given.items()}
        return {
            **{"bos_token": self.bos_token, "eos_token": self.eos_token},
            **given,
            "add_generation_prompt": self.add_generation_prompt,
        }

    def user_values(self, messages: Sequence[Message]) -> dict[str, Any]:
        """The variables whose strings users wrote: messages, tools, documents and extra keywords."""
        return {
            **dict(self.variables),
            "messages": [message_dict(m) for m in messages],
            "tools": [dict(t) for t in self.tools] if self.tools is not None else None,
            "documents": [dict(d) for d in self.documents] if self.documents is not None else None,
        }


_BLOCKED_ATTRIBUTES = frozenset({"mro", "func_globals", "gi_frame", "cr_frame"})


def _environment() -> Any:
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Sandbox(ImmutableSandboxedEnvironment):
        """Jinja's immutable sandbox (its str.format is the sandbox's safe formatter), with more refusals."""

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            if attr in _BLOCKED_ATTRIBUTES:
                return False
            return bool(super().is_safe_attribute(obj, attr, value))

        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            raise SecurityError(f"access to {attribute!r} of a {type(obj).__name__} is not allowed")

        def getattr(self, obj: Any, attribute: str) -> Any:
            if attribute in _BLOCKED_ATTRIBUTES:
                return self.unsafe_undefined(obj, attribute)
            return super().getattr(obj, attribute)

    class Generation(jinja2.ext.Extension):
        """transformers' ``{% generation %}…{% endgeneration %}``: marks the assistant's part; renders its body."""

        tags = {"generation"}  # noqa: RUF012 - Jinja's own attribute

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """transformers' namespace: no underscore-prefixed attributes."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature trick
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"a namespace cannot hold {name!r}")

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: str) -> None:
        raise TemplateError(f"the chat template refused the conversation: {message}", "check the messages")

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:  # transformers': no HTML escaping, and its options
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = Sandbox(
        trim_blocks=True, lstrip_blocks=True, autoescape=False, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(), namespace=Namespace
    )
    return env


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    """``template`` compiled in the sandbox, once: a prompt renders it once or twice (to tell user text
    apart), and a chat every turn; a template that fails to compile is not kept."""
    return _environment().from_string(template)


def render_text(
    template: str,
    messages: Sequence[Message],
    context: Context | None = None,
    *,
    transform: Callable[[Any], Any] | None = None,
) -> str:
    """``template`` rendered with ``messages`` and ``context`` as transformers renders it, within size
    and time limits; ``transform`` rewrites every value the template is given (see :func:`mark`)."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.exceptions import SecurityError

    context = context or Context()
    if context.continue_final_message:
        if not messages:
            raise TemplateError("continue_final_message needs a message to continue", "add one")
        last = messages[-1]
        messages = [*messages[:-1], _replace_content(last, last.content + _CONTINUE_TAG)]
    values = context.values(messages, transform)
    given = sum(len(m.content) + len(m.reasoning or "") for m in messages)
    budget = MAX_OUTPUT_CHARS + 2 * given  # the template's own text, and the messages at most twice
    try:
        compiled = _compiled(template)
        started = time.monotonic()
        out: list[str] = []
        size = 0
        for chunk in compiled.generate(**values):
            size += len(chunk)
            if size > budget:
                raise TemplateError(
                    f"the chat template produced more than {budget:,} characters from {given:,} characters of messages",
                    "the template is broken or hostile; " + PLAIN_PROMPT,
                )
            if time.monotonic() - started > MAX_RENDER_SECONDS:
                raise TemplateError(
                    f"the chat template took more than {MAX_RENDER_SECONDS:.0f} s to render",
                    "the template is broken or hostile; " + PLAIN_PROMPT,
                )
            out.append(chunk)
    except TemplateError:
        raise
    except SecurityError as exc:
        raise TemplateError(f"the chat template tried something unsafe: {exc}", PLAIN_PROMPT) from exc
    except (JinjaError, TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise TemplateError(f"the chat template failed to render: {exc}", PLAIN_PROMPT) from exc
    except (RecursionError, OverflowError, MemoryError) as exc:
        raise TemplateError(f"the chat template failed to render: {type(exc).__name__}", PLAIN_PROMPT) from exc
    except Exception as exc:  # a template is code: whatever else it raises (Jinja compiles some errors into
        # a Python SyntaxError, e.g. {% continue %} outside a loop) is still the template's failure
        raise TemplateError(f"the chat template failed to render: {type(exc).__name__}: {exc}", PLAIN_PROMPT) from exc
    text = "".join(out)
    return _continued(text, messages[-1].content) if context.continue_final_message else text


def _replace_content(message: Message, content: str) -> Message:
    import dataclasses

    return dataclasses.replace(message, content=content)


def _continued(text: str, tagged: str) -> str:
    """transformers' continue_final_message: the prompt cut where the final message's tag is."""
    tag = _CONTINUE_TAG.strip()
    final = tagged[: -len(_CONTINUE_TAG)].strip()
    if final not in text or tag not in text:
        raise TemplateError(
            "continue_final_message: the chat template drops part of the final message",
            "send the conversation without continuing its last message",
        )
    at = text.rindex(tag)
    return text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


# --- special tokens in user text -----------------------------------------------------


def special_pattern(strings: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern matching any of ``strings``, longest first (None for none)."""
    ordered = sorted({s for s in strings if s}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None


def mark(value: Any, pattern: re.Pattern[str]) -> Any:
    """``value`` with every match of ``pattern`` inside its strings (not dict keys) wrapped in the
    private-use markers; markers already there are dropped first, so none can be forged."""
    if isinstance(value, str):
        value = value.replace(MARK_START, "").replace(MARK_END, "")
        return pattern.sub(lambda m: MARK_START + m.group(0) + MARK_END, value)
    if isinstance(value, Mapping):
        return {key: mark(item, pattern) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mark(item, pattern) for item in value]
    return value


def contains(value: Any, pattern: re.Pattern[str]) -> bool:
    """Whether any string inside ``value`` (not dict keys) matches ``pattern``."""
    if isinstance(value, str):
        return pattern.search(value) is not None
    if isinstance(value, Mapping):
        return any(contains(item, pattern) for item in value.values())
    if isinstance(value, list | tuple):
        return any(contains(item, pattern) for item in value)
    return False


_MARKED = re.compile(f"{MARK_START}([^{MARK_START}{MARK_END}]*){MARK_END}|[{MARK_START}{MARK_END}]")


def pieces(marked: str) -> list[Segment]:
    """A rendering of marked values split into the template's text (``special``) and the marked
    strings (plain); a lone marker (a template's ``split`` can separate a pair) is dropped."""
    segments: list[Segment] = []
    position = 0
    for match in _MARKED.finditer(marked):
        if match.start() > position:
            segments.append(Segment(marked[position : match.start()], True))
        if match.group(1):
            segments.append(Segment(match.group(1), False))
        position = match.end()
    if position < len(marked):
        segments.append(Segment(marked[position:], True))
    return segments


def attribute(text: str, marked: str, pattern: re.Pattern[str]) -> list[Segment]:
    """``text`` (the real rendering) split into the template's text and the special-token strings
    users wrote, told apart by ``marked`` (the rendering of marked values).

    The marks can change what a template does next to them (``split('</think>')[-1].lstrip()``
    meets a marker before the whitespace), so the two renderings are aligned rather than
    required equal: each marked string must fall where they agree. A special-token string of
    ``text`` where they disagree cannot be attributed and is refused."""
    import bisect

    from llmrun.prompt.align import TooFar, matching_blocks

    segments = pieces(marked)
    unmarked = "".join(s.text for s in segments)
    spans, at = [], 0
    for segment in segments:
        if not segment.special:
            spans.append((at, at + len(segment.text)))
        at += len(segment.text)
    if unmarked == text:
        return segments
    try:
        blocks = matching_blocks(text, unmarked)
    except TooFar as exc:
        raise TemplateError(
            f"the chat template changes the messages' text around special-token strings over {exc.size:,} "
            "characters in one place",
            "remove the special-token strings from the messages, or send shorter messages",
        ) from None
    starts_b = [b for _, b, _ in blocks]
    starts_a = [a for a, _, _ in blocks]

    def block_at(starts: list[int], position: int) -> tuple[int, int, int] | None:
        index = bisect.bisect_right(starts, position) - 1
        return blocks[index] if index >= 0 else None

    plain: list[tuple[int, int]] = []
    for start, end in spans:
        block = block_at(starts_b, start)
        if block is None or not (block[1] <= start and end <= block[1] + block[2]):
            raise _unattributable(unmarked[start:end])
        plain.append((start - block[1] + block[0], end - block[1] + block[0]))
    kept = set(plain)
    for match in pattern.finditer(text):
        block = block_at(starts_a, match.start())
        inside = block is not None and block[0] <= match.start() and match.end() <= block[0] + block[2]
        if not inside and (match.start(), match.end()) not in kept:
            raise _unattributable(match.group(0))
    result: list[Segment] = []
    position = 0
    for start, end in plain:
        if start > position:
            result.append(Segment(text[position:start], True))
        result.append(Segment(text[start:end], False))
        position = end
    if position < len(text):
        result.append(Segment(text[position:], True))
    return result


def _unattributable(token: str) -> TemplateError:
    return TemplateError(
        f"the chat template treats {token!r} in the messages differently from plain text",
        f"remove {token!r} from the messages",
    )


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


MAX_TEMPLATE_BYTES = 1024 * 1024


def load_template(value: str) -> tuple[str, str]:
    """``--template``: a built-in template's name, or a Jinja file; (the template, where it came from)."""
    from pathlib import Path

    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value], f"{value} (built in)"
    path = Path(value).expanduser()
    hint = f"name a Jinja file, or a built-in template: {', '.join(BUILTIN_TEMPLATES)}"
    if not path.is_file():
        raise TemplateError(f"no template named {value!r} and no such file", hint)
    if path.stat().st_size > MAX_TEMPLATE_BYTES:
        raise TemplateError(f"{path} is larger than a chat template may be (1 MiB)", hint)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"cannot read the template {path}: {exc}", hint) from None
    try:
        _compiled(text)  # compiled, not only parsed: some errors show only then
    except Exception as exc:  # a syntax error: said now, not at the first message
        raise TemplateError(f"{path} is not a valid Jinja template: {exc}", "fix the file") from None
    return text, f"file {path}"


def builtin_for(architecture: str) -> str:
    """The built-in template name for a model architecture (ChatML when unknown)."""
    return _BY_ARCHITECTURE.get(architecture, "chatml")
