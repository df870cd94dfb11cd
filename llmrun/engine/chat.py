"""A chat conversation over a loaded model (no terminal I/O here).

Each reply renders the whole conversation through the chat template and hands it
to the backend, which keeps its KV cache between turns and evaluates only the
tokens after the longest common prefix with what it already holds: the new user
message, not the history. When the next turn would not fit the context, the
oldest turns are dropped (the system prompt stays), or with ``on_overflow="error"``
the turn is refused. Conversations save to and load from JSON, atomically.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llmrun.backends.base import SeesImages
from llmrun.decoding.events import Done, GenerationStats, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.decoding.tokens import common_prefix
from llmrun.engine.core import generate
from llmrun.engine.load import Loaded, local
from llmrun.engine.request import Prepared, Request, Templates, request_ids
from llmrun.engine.result import Result
from llmrun.errors import ContextFull, InvalidParameter, StoreError, UsageError
from llmrun.files import SAFE_NAME, atomic_write_text
from llmrun.prompt.render import Prompt, render_prompt
from llmrun.prompt.template import Message
from llmrun.remote.model import RemoteModel
from llmrun.structured.formats import Format

OnOverflow = Literal["drop", "error"]
SAVE_VERSION = 1
MAX_SAVED_BYTES = 64 * 1024 * 1024  # a conversation with a few photos in it
PARAM_ALIASES = {
    "t": "temperature",
    "temp": "temperature",
    "n": "max_tokens",
    "ctx": "n_ctx",
    "threads": "n_threads",
    "gpu_layers": "n_gpu_layers",
    "kv_bits": "kv_type",
}
LOAD_PARAMS = frozenset({"n_ctx", "n_threads", "n_gpu_layers", "kv_type"})  # fixed once the model is loaded


@dataclass
class Turn:
    role: Literal["user", "assistant"]
    content: str
    interrupted: bool = False
    reasoning: str | None = None  # an answer's reasoning, kept apart: the template decides what it shows
    images: tuple[bytes, ...] = ()  # a message's images (files' bytes), read before its text


@dataclass(frozen=True, slots=True)
class TurnReport:
    stats: GenerationStats | None  # None when interrupted
    prompt_tokens: int
    cached_tokens: int  # prompt tokens already in the KV cache (from earlier turns, or the KV store on disk)
    dropped_turns: int
    interrupted: bool


@dataclass
class ChatSession:
    model: Loaded
    model_name: str
    template: str
    template_name: str
    params: SamplingParams
    system: str | None = None
    on_overflow: OnOverflow = "drop"
    turns: list[Turn] = field(default_factory=list)
    last: TurnReport | None = None
    answer_format: Format | None = None  # every answer constrained to it (/set format json, /set schema FILE)
    think: bool | None = None  # a reasoning model's enable_thinking (None: the template's default)
    last_prompt: Prompt | None = None  # the prompt of the last answer, as the model read it
    _cached: list[int] = field(default_factory=list)

    # --- conversation -----------------------------------------------------------
    def messages(self, turns: list[Turn] | None = None) -> list[Message]:
        head = [Message("system", self.system)] if self.system else []
        return head + [
            Message(t.role, t.content, reasoning=t.reasoning, images=t.images)
            for t in (self.turns if turns is None else turns)
        ]

    def prompt(self, *, add_generation_prompt: bool = True) -> Prompt:
        """The conversation so far, rendered and tokenized as the model reads it (a local model's)."""
        model = local(self.model, "show the prompt it reads")
        variables = self.request().variables  # as the engine renders the answer's prompt
        return render_prompt(
            model, self.template, self.messages(), add_generation_prompt=add_generation_prompt, variables=variables
        )

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    @property
    def remote(self) -> bool:
        """A remote engine's model: it renders the conversation itself, and fits it to its context."""
        return isinstance(self.model, RemoteModel)

    @property
    def templates(self) -> Templates:
        """The conversation's template, as the engine takes it."""
        return Templates(self.template, self.template, self.template_name)

    def request(self) -> Request:
        """The conversation so far as the engine's request for the next answer."""
        return Request(
            messages=tuple(self.messages()), params=self.params, response_format=self.answer_format, think=self.think
        )

    @property
    def context_used(self) -> int:
        """Tokens the conversation occupies now (prompt and answers; on a remote engine, as of the last answer)."""
        if not self.turns and not self.system:
            return 0
        if self.remote:
            stats = self.last.stats if self.last else None
            return stats.prompt_tokens + stats.generated_tokens if stats else 0
        images = tuple(image for turn in self.turns for image in turn.images)
        return len(self.prompt(add_generation_prompt=False).ids) + self._image_positions(images)

    def _image_positions(self, images: tuple[bytes, ...]) -> int:
        """The context positions ``images`` take (0 on a model without a projector: it refuses them anyway)."""
        if not images or not isinstance(self.model, SeesImages) or not self.model.sees_images:
            return 0
        return sum(self.model.image_positions(image) for image in images)

    def reply(self, text: str, images: tuple[bytes, ...] = ()) -> Generator[Token | Done, None, None]:
        """Add the user's message (with ``images``, read before its text) and stream the answer (kept in the
        history, even if cut short)."""
        if images and not (isinstance(self.model, SeesImages) and self.model.sees_images):
            raise UsageError(
                f"{self.model_name} does not see images: it was loaded without a projector",
                "restart the chat with `mmproj` (the model's mmproj GGUF)",
            )
        self.turns.append(Turn("user", text, images=images))
        try:
            fitted = self._fit()
        except ContextFull:
            self.turns.pop()
            raise
        yield from self._generate(*fitted)

    def retry(self) -> Generator[Token | Done, None, None]:
        """Regenerate the last answer."""
        if self.turns and self.turns[-1].role == "assistant":
            self.turns.pop()
        if not self.turns:
            raise UsageError("nothing to retry yet", "send a message first")
        yield from self._generate(*self._fit())

    def clear(self) -> None:
        self.turns.clear()
        self.last = None

    def _reserve(self) -> int:
        wanted = self.params.max_tokens if self.params.max_tokens > 0 else 512
        return max(1, min(wanted, self.n_ctx // 2))

    def _fit(self) -> tuple[Request, Prepared | None, int]:
        """The request for the next answer, its prompt as the model reads it, and how many turns were
        dropped to fit it (a remote engine fits the conversation itself: no prompt, none dropped)."""
        if isinstance(self.model, RemoteModel):
            return self.request(), None, 0
        dropped = 0
        while True:
            request = self.request()
            prepared = request_ids(self.model, self.templates, request)
            ids = [*prepared.ids, *range(self._image_positions(prepared.images))]  # only its length counts
            if len(ids) + self._reserve() <= self.n_ctx:
                return request, prepared, dropped
            if self.on_overflow == "error":
                raise ContextFull(
                    f"the conversation is {len(ids)} tokens and the answer needs room for {self._reserve()}, "
                    f"but the context holds {self.n_ctx}",
                    "/clear to start over, lower max_tokens with /set, or restart with a larger `n_ctx`",
                )
            if len(self.turns) <= 1:
                raise ContextFull(
                    f"your message alone is {len(ids)} tokens; with room for the answer it does not fit "
                    f"the {self.n_ctx}-token context",
                    "shorten it, lower max_tokens with /set, or restart with a larger `n_ctx`",
                )
            del self.turns[0]
            if self.turns and self.turns[0].role == "assistant" and len(self.turns) > 1:
                del self.turns[0]
            dropped += 1

    def _generate(
        self, request: Request, prepared: Prepared | None, dropped: int
    ) -> Generator[Token | Done, None, None]:
        """The answer's events through the engine's one generation path (a reasoning model's reasoning in
        ``Token.reasoning``), its Result given as a Done; the answer is kept in the history with its
        reasoning apart, as chat templates expect it, even when it is cut short."""
        ids = prepared.ids if prepared is not None else []
        self.last_prompt = prepared.prompt if prepared is not None else None
        cached = common_prefix(self._cached, ids)
        answer: list[str] = []
        reasoning: list[str] = []
        generated: list[int] = []
        result: Result | None = None
        try:
            for event in generate(self.model, self.templates, request, prepared):
                if isinstance(event, Result):
                    result = event
                    continue
                answer.append(event.text)
                reasoning.append(event.reasoning)
                if event.id >= 0:
                    generated.append(event.id)
                yield event
            assert result is not None
            yield Done(result.text, result.stats())
        finally:
            if result is not None:
                thought, text = result.reasoning, result.text
            else:  # interrupted: what was shown
                thought = "".join(reasoning) or None
                text = "".join(answer)
            self.turns.append(Turn("assistant", text, result is None, thought))
            self._cached = ids + generated
            stats = result.stats() if result is not None else None
            prompt_tokens = stats.prompt_tokens if stats is not None else len(ids)  # images count too
            cached = stats.cached_tokens if stats is not None else cached  # the backend's count: the KV store's too
            self.last = TurnReport(stats, prompt_tokens, cached, dropped, result is None)

    # --- settings ---------------------------------------------------------------
    def set_param(self, name: str, value: str) -> tuple[str, Any]:
        """``/set NAME VALUE`` with the same validation as the flags; returns the field and new value.
        ``format`` (json | off), ``schema`` FILE and ``grammar`` FILE set what every answer must be."""
        normal = name.lower().replace("-", "_")
        key = PARAM_ALIASES.get(normal, normal)
        if key == "think":
            self.think = _parse_think(value)
            return "think", "default" if self.think is None else "on" if self.think else "off"
        if key in FORMAT_PARAMS:
            self.answer_format = _answer_format(key, value.strip())
            return "format", self.answer_format.kind if self.answer_format else "off"
        fields = {f.name: f for f in dataclasses.fields(SamplingParams)}
        if key in LOAD_PARAMS:
            raise UsageError(
                f"{name} is set when the model loads; it cannot change during a chat",
                f"/save NAME, then restart with `{key}` {value} and /load NAME",
            )
        if key not in fields:
            import difflib

            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"did you mean {close[0]}?" if close else f"parameters: {', '.join(fields)}"
            raise UsageError(f"unknown parameter {name!r}", hint)
        parsed = _parse_value(key, value, getattr(self.params, key))
        try:
            self.params = dataclasses.replace(self.params, **{key: parsed})
        except InvalidParameter as exc:
            raise UsageError(*exc.worded({key: f"/set {key}"})) from None
        return key, getattr(self.params, key)

    # --- files ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": SAVE_VERSION,
            "model": self.model_name,
            "template": self.template_name,
            "system": self.system,
            "params": self.params.to_dict(),
            "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "messages": [_saved_turn(t) for t in self.turns],
        }

    def save(self, directory: Path, name: str) -> Path:
        path = directory / f"{_check_name(name)}.json"
        try:
            atomic_write_text(path, json.dumps(self.to_json(), ensure_ascii=False, indent=2))
        except OSError as exc:
            raise StoreError(
                f"cannot save the chat to {path}: {exc.strerror}", "check the disk and permissions"
            ) from exc
        return path

    def load(self, directory: Path, name: str) -> dict[str, Any]:
        """Replace the conversation with a saved one; returns the saved record."""
        path = directory / f"{_check_name(name)}.json"
        record = read_saved(path)
        self.system = record["system"]
        self.turns = [
            Turn(
                m["role"],
                m["content"],
                bool(m.get("interrupted", False)),
                m.get("reasoning"),
                tuple(base64.b64decode(image) for image in m.get("images", ())),
            )
            for m in record["messages"]
        ]
        self.params = SamplingParams(**{k: v for k, v in record["params"].items()})
        self.last = None
        return record

    def export_markdown(self, path: Path) -> Path:
        lines = [f"# Chat with {self.model_name}", ""]
        if self.system:
            lines += [f"*System:* {self.system}", ""]
        for turn in self.turns:
            who = "You" if turn.role == "user" else self.model_name
            note = " *(interrupted)*" if turn.interrupted else ""
            lines += [f"**{who}:**{note}", "", turn.content.strip(), ""]
        try:
            atomic_write_text(path, "\n".join(lines))
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc.strerror}", "check the path and permissions") from exc
        return path


FORMAT_PARAMS = ("format", "schema", "grammar")


def _answer_format(key: str, value: str) -> Format | None:
    from llmrun.structured import ANY_JSON, load_grammar, load_schema
    from llmrun.structured.grammar import compile_format

    if key == "format" and value.lower() in ("off", "none", "text"):
        return None
    if key == "format" and value.lower() != "json":
        raise UsageError(f"/set format takes json or off, got {value!r}", "/set schema FILE for a JSON Schema")
    fmt = ANY_JSON if key == "format" else load_schema(value) if key == "schema" else load_grammar(Path(value))
    compile_format(fmt)  # one the decoder cannot enforce is refused now, not at the next message
    return fmt


def _parse_think(value: str) -> bool | None:
    word = value.strip().lower()
    if word in ("on", "true", "yes", "1"):
        return True
    if word in ("off", "false", "no", "0"):
        return False
    if word in ("default", "auto"):
        return None
    raise UsageError(f"/set think takes on, off or default, got {value!r}", "e.g. /set think off")


def _check_name(name: str) -> str:
    if not SAFE_NAME.fullmatch(name) or name.endswith(".json"):
        raise UsageError(
            f"{name!r} is not a valid chat name",
            "use letters, digits, '.', '_' or '-' (up to 64, no paths), e.g. /save trip-plan",
        )
    return name


def _parse_value(key: str, text: str, current: Any) -> Any:
    text = text.strip()
    if key == "stop":
        return tuple(s for s in text.split("|") if s) if text else ()
    if key == "seed" and text.lower() in ("none", "random", ""):
        return None
    try:
        if isinstance(current, bool):
            raise ValueError
        if key in ("top_k", "repeat_last_n", "seed", "max_tokens"):
            return int(text)
        return float(text)
    except ValueError:
        kind = "an integer" if key in ("top_k", "repeat_last_n", "seed", "max_tokens") else "a number"
        raise UsageError(f"/set {key} needs {kind}, got {text!r}", f"e.g. /set {key} 1") from None


def _saved_turn(turn: Turn) -> dict[str, Any]:
    """A turn as a saved chat keeps it: its images (when it has any) as base64."""
    saved = dataclasses.asdict(turn)
    del saved["images"]
    if turn.images:
        saved["images"] = [base64.b64encode(image).decode("ascii") for image in turn.images]
    return saved


def read_saved(path: Path) -> dict[str, Any]:
    """A saved chat, validated; a missing, oversized or malformed file is a clear error."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UsageError(f"no saved chat named {path.stem!r}", "/load lists nothing yet; /save NAME first") from None
    if size > MAX_SAVED_BYTES:
        raise UsageError(f"{path} is {size:,} bytes, more than a chat file may be", "it is not a saved chat")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path} is not a valid saved chat: {exc}", "it was damaged or edited by hand") from None
    problem = _schema_problem(record)
    if problem:
        raise UsageError(f"{path} is not a valid saved chat: {problem}", "it was damaged or edited by hand")
    try:
        SamplingParams(**record["params"])
    except (InvalidParameter, TypeError) as exc:
        raise UsageError(f"{path} is not a valid saved chat: bad params ({exc})", "it was edited by hand") from None
    return dict(record)


def _images_problem(images: Any) -> str | None:
    """What is wrong with a saved message's images (base64 of PNG, JPEG, GIF or BMP files), if anything."""
    from llmrun.formats.image import ImageError, sniff

    if not isinstance(images, list) or not all(isinstance(image, str) for image in images):
        return "images is not a list of base64 strings"
    for image in images:
        try:
            sniff(base64.b64decode(image, validate=True))
        except (ValueError, ImageError) as exc:
            return f"an image is not one ({exc})"
    return None


def _schema_problem(record: Any) -> str | None:
    if not isinstance(record, dict) or record.get("version") != SAVE_VERSION:
        return f"expected a version {SAVE_VERSION} chat object"
    if not isinstance(record.get("system"), (str, type(None))) or not isinstance(record.get("params"), dict):
        return "system or params have the wrong type"
    messages = record.get("messages")
    if not isinstance(messages, list):
        return "messages is not a list"
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ("user", "assistant")
            or not isinstance(message.get("content"), str)
            or not isinstance(message.get("reasoning"), (str, type(None)))
        ):
            return f"message {index} needs a role (user or assistant) and text content"
        problem = _images_problem(message.get("images", []))
        if problem:
            return f"message {index}: {problem}"
    if "stop" in record["params"] and isinstance(record["params"]["stop"], list):
        record["params"]["stop"] = tuple(record["params"]["stop"])
    return None


def list_saved(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.json")) if directory.is_dir() else []
