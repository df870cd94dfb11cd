"""Constrained decoding through llguidance: a :class:`Format` becomes a token mask at every step.

llguidance (the engine llama.cpp, vLLM and SGLang use) compiles a JSON Schema or a Lark grammar
against the model's vocabulary and answers, after each token, which tokens may come next; the
end-of-text tokens are allowed only where the grammar is complete. A schema keyword it cannot
enforce is an error naming the keyword, never a silent fallback to unconstrained text.

A backend applies a :class:`Constraint` in two calls: :meth:`Constraint.mask` before it samples
(logits of tokens the grammar forbids become -inf) and :meth:`Constraint.accept` with each token
it sampled — or, where the backend's loop only offers a logits processor, :meth:`Constraint.follow`,
which accepts the tokens a processor sees appended since its last call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from llmrun.errors import UsageError, backend_cannot
from llmrun.structured.formats import Format, declared_only

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from llguidance._lib import JsonCompileOptions

# JSON the way people and models write it ({"a": 1, "b": [2, 3]}), with no freedom for whitespace:
# with free whitespace a small model can fill its whole budget with newlines inside a valid document.
MAX_DIGITS = 16  # a run of digits ends here where the grammar allows anything else (llama.cpp's JSON bound)
CLOSE_SHARE, CLOSE_MIN = 8, 24  # a JSON answer is steered to its end in the last eighth of its budget (>= 24)
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "coerce_one_of": True,  # oneOf as anyOf; the answer is checked against oneOf (structured.formats.conforms)
}


class UnsupportedFormat(UsageError):
    """A schema or grammar the constrained decoder cannot enforce (names what it cannot)."""


def _what(fmt: Format) -> str:
    return "this grammar" if fmt.kind in ("lark", "gbnf") else "this schema"


def _reason(message: str) -> str:
    """llguidance's message, in a user's words where it names keywords it does not enforce."""
    line = message.strip().splitlines()[0] if message.strip() else "invalid"
    if line.startswith("Unimplemented keys:"):
        return f"it uses {line.partition(':')[2].strip()}, which constrained decoding cannot enforce"
    return line


@dataclass(frozen=True, slots=True)
class Compiled:
    """A format as llguidance enforces it, and what it enforces differently from the schema as written."""

    grammar: str
    notes: tuple[str, ...] = ()


def compile_format(fmt: Format) -> str:
    """``fmt`` as an llguidance grammar, checked; :class:`UnsupportedFormat` naming the first problem."""
    return compiled(fmt).grammar


def format_notes(fmt: Format) -> tuple[str, ...]:
    """Where ``fmt`` is enforced less strictly than written (its answers are still checked as written)."""
    return compiled(fmt).notes


MAX_ANNOTATIONS = 16  # distinct unknown formats dropped before the schema is refused


@functools.lru_cache(maxsize=64)  # at most 64 × 2 × MAX_SOURCE bytes kept
def compiled(fmt: Format) -> Compiled:
    """``fmt`` compiled. A ``format`` llguidance does not know is dropped (JSON Schema makes an unknown
    format an annotation, which validators ignore), and ``oneOf`` is enforced as ``anyOf`` (the answer
    is then checked against ``oneOf`` by :func:`llmrun.structured.formats.conforms`); both are noted."""
    from llguidance import LLMatcher, grammar_from

    dropped: list[str] = []
    while True:
        try:
            if fmt.kind in ("json", "schema"):
                schema = declared_only(fmt.schema(), frozenset(dropped))
                grammar = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
            else:
                grammar = grammar_from("gbnf" if fmt.kind == "gbnf" else "lark", fmt.text)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # e.g. an integer JSON cannot carry
            raise _unsupported(fmt, str(exc)) from None
        failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
        unknown = _unknown_format(messages[0]) if failed and messages and fmt.kind == "schema" else None
        if unknown is None or unknown in dropped or len(dropped) >= MAX_ANNOTATIONS:
            break
        dropped.append(unknown)
    if failed:
        raise _unsupported(fmt, messages[0])
    notes = [
        f"`format: {name}` is not enforced (JSON Schema treats a format it does not know as an annotation)"
        for name in dropped
    ]
    if any("falling back to anyOf" in message for message in messages):
        notes.append("`oneOf` is enforced as `anyOf`; an answer that matches more than one branch is not valid")
    return Compiled(grammar, tuple(notes))


def _unknown_format(message: str) -> str | None:
    prefix = "Unknown format: "
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line[len(prefix) :].strip() or None if line.startswith(prefix) else None


def _unsupported(fmt: Format, message: str) -> UnsupportedFormat:
    """llguidance's refusal of ``fmt`` as one line: what cannot be enforced, and what to do."""
    return UnsupportedFormat(f"{_what(fmt)} cannot be enforced: {_reason(message)}", _advice(fmt, message))


def _advice(fmt: Format, message: str) -> str:
    if fmt.kind in ("lark", "gbnf"):
        return "fix the grammar (Lark as llguidance reads it, or GBNF as llama.cpp reads it)"
    if "Unimplemented" in message or "Unknown format" in message:
        return "drop or rewrite that keyword; llmrun never falls back to unconstrained output"
    return "fix the schema; it must be a valid JSON Schema"


class Constraint:
    """One sequence's grammar state: which tokens may come next, and whether the text is complete."""

    def __init__(self, tokenizer: Any, fmt: Format) -> None:
        from llguidance import LLMatcher

        self.format = fmt
        self._matcher = LLMatcher(tokenizer, compile_format(fmt), log_level=0)
        if self._matcher.is_error():
            raise _unsupported(fmt, self._matcher.get_error())
        self._ends = frozenset(tokenizer.eos_tokens)
        self._n_vocab = int(tokenizer.vocab_size)
        self.accepted = 0  # tokens fed to the grammar
        self._seen = 0  # calls of follow()
        self.failed = False  # a token the grammar rejects was chosen (a stop string, or a backend bug)
        self.ended = False  # an end-of-text token was chosen
        self._tokenizer = tokenizer
        self.digits = 0  # digits at the end of the text so far
        self.budget: int | None = None  # the tokens the answer may take (set by the assembler that counts them)
        self.steered = 0  # tokens chosen among closers only, the budget running out
        self._in_string = False  # (JSON) the text so far ends inside a string
        self._escaped = False

    # --- the grammar's side -------------------------------------------------------
    def accept(self, token_id: int) -> None:
        """The backend chose ``token_id``: advance the grammar (an end-of-text token ends it)."""
        if self.ended or self.failed:
            return
        if token_id in self._ends:
            self.ended = True
            return
        self.accepted += 1
        if not self._matcher.consume_token(token_id):
            self.failed = True
        piece = self._tokenizer.decode_bytes([token_id])
        run = len(piece) - len(piece.rstrip(b"0123456789"))
        self.digits = self.digits + run if run == len(piece) else run
        if self.format.is_json:
            self._in_string, self._escaped = _string_state(piece, self._in_string, self._escaped)

    def catch_up(self, generated: Sequence[int]) -> None:
        """Accept what of ``generated`` (the sequence's tokens so far) the grammar has not seen."""
        for token_id in generated[self.accepted :]:
            self.accept(token_id)

    def follow(self, context: Sequence[int] | Any) -> None:
        """For a logits processor called once before each sampled token with the tokens so far:
        from its second call on, the last of them is the token sampled after the previous call."""
        if self._seen:
            self.accept(int(context[-1]))
        self._seen += 1

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole sentence of the grammar."""
        return not self.failed and self._matcher.is_accepting()

    @property
    def finished(self) -> bool:
        """Whether nothing may follow the text but the end (a longer sentence is impossible)."""
        return self.complete and self._matcher.is_stopped()

    # --- the logits' side ---------------------------------------------------------------
    def allowed(self) -> npt.NDArray[np.bool_] | None:
        """One flag per token of the model's output layer, or None when no mask applies (the
        sequence has ended or failed; whatever comes after is not part of the answer)."""
        import numpy as np

        if self.ended or self.failed or self._matcher.is_error():
            return None
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(words, bitorder="little").view(np.bool_)
        if bits.size < self._n_vocab:
            bits = np.concatenate([bits, np.zeros(self._n_vocab - bits.size, dtype=np.bool_)])
        flags: npt.NDArray[np.bool_] = bits[: self._n_vocab]
        if self._closing():  # the budget runs out: close what is open, as soon as the grammar lets it
            classes = _token_classes(self._tokenizer)
            closers = flags & (classes.quote_ends if self._in_string else classes.ends)
            if closers.any():
                self.steered += 1
                return closers
        if self.digits >= MAX_DIGITS:  # a number (or digits in a string) running on: end it where it may end,
            classes = _token_classes(self._tokenizer)  # else move it on (0.000… stays above 0 forever)
            for unwanted in (classes.digits, classes.zeros):
                others = flags & ~unwanted
                if others.any():
                    return others
        return flags

    def _closing(self) -> bool:
        """Whether a JSON answer is near the end of its budget: the last eighth (at least 24 tokens), where
        it is steered to its shortest end — each open string, array and object closed where the schema
        allows, the required properties still written — so that it finishes instead of being cut."""
        if self.budget is None or not self.format.is_json:
            return False
        return self.budget - self.accepted <= max(CLOSE_MIN, self.budget // CLOSE_SHARE)

    def mask(self, logits: npt.NDArray[np.float32]) -> None:
        """Forbidden tokens' logits become -inf, in place (``logits`` may be longer or shorter than
        the tokenizer's vocabulary: padding rows of the output layer are never allowed)."""
        import numpy as np

        flags = self.allowed()
        if flags is None:
            return
        keep = np.flatnonzero(flags[: logits.shape[-1]])
        values = logits[keep]
        logits.fill(-np.inf)
        logits[keep] = values

    def mask_mlx(self, logits: Any) -> Any:
        """:meth:`mask` for an MLX logits array (shape ``(1, vocabulary)``); returns the masked array."""
        import mlx.core as mx
        import numpy as np

        flags = self.allowed()
        if flags is None:
            return logits
        width = logits.shape[-1]
        row = np.zeros(width, dtype=np.bool_)
        n = min(width, flags.size)
        row[:n] = flags[:n]
        return mx.where(mx.array(row), logits, mx.array(-np.inf, dtype=logits.dtype))


def _string_state(piece: bytes, inside: bool, escaped: bool) -> tuple[bool, bool]:
    """Whether JSON text ends inside a string (and after a backslash there) once ``piece`` follows."""
    for byte in piece:
        if inside and escaped:
            escaped = False
        elif inside and byte == 0x5C:  # backslash
            escaped = True
        elif byte == 0x22:  # quote
            inside = not inside
    return inside, escaped


class TokenClasses(NamedTuple):
    """Tokens of a vocabulary by what they do in JSON, one flag per token (built in one pass over the
    vocabulary, the first time a run of digits gets long or an answer nears the end of its budget)."""

    digits: npt.NDArray[np.bool_]  # begin with a digit
    zeros: npt.NDArray[np.bool_]  # only zeros
    ends: npt.NDArray[np.bool_]  # only close (``]`` and ``}`` runs), or end the text
    quote_ends: npt.NDArray[np.bool_]  # close a string, then only ``]``/``}`` (``"``, ``"}``; not ``", "``)


@functools.lru_cache(maxsize=4)
def _token_classes(tokenizer: Any) -> TokenClasses:
    import numpy as np

    size = int(tokenizer.vocab_size)
    classes = TokenClasses(*(np.zeros(size, dtype=np.bool_) for _ in range(4)))
    for token_id in range(size):
        piece = tokenizer.decode_bytes([token_id])
        if not piece:
            continue
        classes.digits[token_id] = 48 <= piece[0] <= 57
        classes.zeros[token_id] = not piece.strip(b"0")
        classes.ends[token_id] = not piece.strip(b"]}")
        classes.quote_ends[token_id] = piece[:1] == b'"' and not piece[1:].strip(b"]}")
    classes.ends[list(tokenizer.eos_tokens)] = True
    return classes


def marker_for(model: object) -> Callable[[str], str]:
    """How a grammar for ``model`` spells a marker such as ``<tool_call>``: as the special token when
    its vocabulary has one (``<[id]>``: text cannot produce a special token), else as the text."""
    import json

    def marker(text: str) -> str:
        tokenizer = constraining(model, "call tools").grammar_tokenizer()
        ids = tokenizer.tokenize_bytes(text.encode("utf-8"), parse_special=True)
        if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text, ensure_ascii=False)

    return marker


def constraint_for(model: object, fmt: Format) -> Constraint:
    """A fresh constraint for one sequence on ``model`` (a bad format fails before the model's
    grammar tokenizer is built)."""
    compile_format(fmt)
    return Constraint(constraining(model, "constrain its output to a format").grammar_tokenizer(), fmt)


@runtime_checkable
class Constrains(Protocol):
    """Constrained decoding (structured output): the model's vocabulary as llguidance reads it, built
    once per loaded model; its ``stream`` and batch decoder apply a request's constraint."""

    def grammar_tokenizer(self) -> Any: ...


def constraining(model: object, what: str) -> Constrains:
    if not isinstance(model, Constrains):
        raise backend_cannot(what)
    return model
