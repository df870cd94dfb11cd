"""A dialect's calls as a Lark grammar for llguidance (pure: the grammar is text).

Each offered function is one alternative, written exactly as the family's template writes a call: the
fixed text of the pattern (a special token where the vocabulary has one), the function's name, and its
arguments in the family's own syntax, typed by the function's JSON Schema — a JSON object
(``%json``), parameters one by one (a string as raw text up to the closing text, anything else as
JSON), Python keyword arguments or Gemma 4's object. Parameters come in the schema's order; the
required ones always, the others optionally.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmrun.structured.dialects.pattern import Segment, is_string, segments
from llmrun.structured.formats import Format, declared_only

if TYPE_CHECKING:
    from llmrun.structured.dialects.syntax import Syntax
    from llmrun.structured.tools import Marker, Tool, ToolUse

# pieces of a literal that may be one special token in a vocabulary: <|x|>, <｜x｜>, [X], <x>, </x>
_SPECIAL = re.compile(r"<\|[^<>|]*\|>|<｜[^<>｜]*｜>|\[[A-Z_]+\]|</?[A-Za-z_][\w:.\-]*>")
JSON_TYPES = {"integer": "number", "number": "number", "boolean": "boolean", "null": "null", "object": "object"}


def calls_format(syntax: Syntax, use: ToolUse, marker: Marker, answer: Format | None) -> Format:
    from llmrun.structured.tools import MAX_PARALLEL_CALLS, grammar_with_text, text_without

    writer = _Writer(syntax, marker)
    single = not use.parallel or use.mode == "function"
    most = 1 if single else min(MAX_PARALLEL_CALLS, syntax.most)
    between = writer.blanks_optional(syntax.between)  # (templates of one family differ in them)
    if "{index}" in syntax.call:  # each call numbered by its place, as the template numbers them
        rules = [
            f"call_at_{p}: " + " | ".join(writer.call(t, p + syntax.first_index) for t in use.callable())
            for p in range(most)
        ]
        chain = ""
        for place in reversed(range(1, most)):
            chain = f"({between} call_at_{place} {chain})?"
        body = f"call_at_0 {chain}"
    else:
        rules = ["call: " + " | ".join(writer.call(t) for t in use.callable())]
        body = "call" + ("" if most == 1 else f" ({between} call)~0..{most - 1}")
    calls = f"calls: {writer.literal(syntax.opens[0])} {body} {writer.literal(syntax.close)}"
    return grammar_with_text(use, "calls", [calls, *rules, *writer.rules], text_without(syntax.start), answer)


@dataclass
class _Writer:
    syntax: Syntax
    marker: Callable[[str], str]
    rules: list[str] = field(default_factory=list)
    _count: int = 0

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def literal(self, text: str) -> str:
        """A literal as Lark: special tokens as themselves where the vocabulary has them, the rest as text
        (in a loose family, each run of blanks optional)."""
        if self.syntax.loose:
            return self.blanks_optional(text)
        return self._tokens(text)

    def blanks_optional(self, text: str) -> str:
        pieces = re.split(r"(\s+)", text)
        return " ".join(f"({json.dumps(p)})?" if p.isspace() else self._tokens(p) for p in pieces if p)

    def _tokens(self, text: str) -> str:
        out: list[str] = []
        position = 0
        for match in _SPECIAL.finditer(text):
            spelled = self.marker(match.group())
            if spelled.startswith("<["):
                if match.start() > position:
                    out.append(json.dumps(text[position : match.start()], ensure_ascii=False))
                out.append(spelled)
                position = match.end()
        if position < len(text):
            out.append(json.dumps(text[position:], ensure_ascii=False))
        return " ".join(out)

    def special(self, text: str) -> bool:
        return any(self.marker(m.group()).startswith("<[") for m in _SPECIAL.finditer(text))

    def call(self, tool: Tool, index: int = 0) -> str:
        schema = declared_only(json.loads(tool.parameters))
        rule = self.fresh("call")
        if self.syntax.json_call:  # one JSON document (text and a JSON answer then share a lexer)
            from llmrun.structured.tools import call_schema

            document = call_schema([tool], self.syntax.json_call)
            self.rules.append(f"{rule}: %json {json.dumps(document, ensure_ascii=False)}")
            return rule
        body = self._pattern(segments(self.syntax.call), tool.name, schema, index=index)
        self.rules.append(f"{rule}: {body}")
        return rule

    def _pattern(self, pattern: tuple[Segment, ...], name: str, schema: Any, key: str = "", index: int = 0) -> str:
        out: list[str] = []
        skip = False
        for number, segment in enumerate(pattern):
            if skip:
                skip = False
                continue
            following = pattern[number + 1] if number + 1 < len(pattern) else None
            kind = segment.kind
            if kind == "lit":
                out.append(self.literal(segment.text))
            elif kind == "name":
                out.append(json.dumps(name))
            elif kind == "key":
                out.append(json.dumps(key, ensure_ascii=False))
            elif kind == "args":
                out.append("%json " + json.dumps(schema, ensure_ascii=False))
            elif kind == "params":
                out.append(self._sequence(schema, "", self._parameter))
            elif kind == "python":
                out.append(self._sequence(schema, ", ", self._python))
            elif kind == "gemma":
                out.append('"{" ' + self._sequence(schema, ",", self._gemma) + ' "}"')
            elif kind == "id":
                out.append(f"/{self.syntax.id}/")
            elif kind == "index":
                out.append(json.dumps(str(index)))
            elif kind == "typed":
                out.append(json.dumps(self._typed(schema)))
            elif kind == "value":
                value, skip = self._value(schema, following)
                out.append(value)
        return " ".join(piece for piece in out if piece)

    def _typed(self, schema: Any) -> str:
        if self.syntax.typed == "dsml":
            return "true" if is_string(schema) else "false"
        if is_string(schema):
            return "string"
        kind = schema.get("type") if isinstance(schema, dict) else None
        return JSON_TYPES.get(kind, "array") if isinstance(kind, str) else "string"

    def _value(self, schema: Any, following: Segment | None) -> tuple[str, bool]:
        """A parameter's value, and whether it took the literal after it (as a lazy text's end)."""
        if not is_string(schema):
            return "%json " + json.dumps(schema if isinstance(schema, dict) else {}, ensure_ascii=False), False
        end = following.text if following is not None else ""
        choices = schema.get("enum") if isinstance(schema, dict) else None
        if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
            return "(" + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices) + ")", False
        if self.syntax.loose and end != end.rstrip():  # the blanks after the closing text are optional
            rule, _ = self.text_until(end.rstrip(), schema)
            return f"{rule} {self.literal(end[len(end.rstrip()) :])}", True
        return self.text_until(end, schema)

    def text_until(self, end: str, schema: Any = None) -> tuple[str, bool]:
        """Raw text that ends at the first ``end`` (written as part of it), within the string schema's
        ``minLength``/``maxLength`` when it has them."""
        rule = self.fresh("text")
        bounds = _length(schema)
        if end and not self.special(end):
            self.rules.append(f"{rule}[suffix={json.dumps(end, ensure_ascii=False)}]: /(?s:.{bounds})/")
            return rule, True
        self.rules.append(f"{rule}: /(?s:.{bounds})/")
        return rule, False

    def _parameter(self, key: str, schema: Any) -> str:
        return self._pattern(segments(self.syntax.params), "", schema, key)

    def _python(self, key: str, schema: Any) -> str:
        # (LFM2's template writes a string's new lines as they are)
        strings = {"string": r"/'(?:[^'\\]|\\.)*'/"}
        return f"{json.dumps(key + '=')} {_scalar(schema, ('True', 'False', 'None'), strings)}"

    def _gemma(self, key: str, schema: Any) -> str:
        from llmrun.structured.dialects.values import GEMMA_QUOTE

        if is_string(schema):
            text, _ = self.text_until(GEMMA_QUOTE, schema)
            value = f"{self.literal(GEMMA_QUOTE)} {text}"
        else:
            value = _scalar(schema, ("true", "false", "null"))
        return f"{json.dumps(key + ':')} {value}"

    def _sequence(self, schema: Any, separator: str, item: Callable[[str, Any], str]) -> str:
        """The schema's properties in order, separated: the required ones always, the others optionally."""
        properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
        required = set(schema.get("required", [])) if isinstance(schema, dict) else set()
        names = list(properties)
        if not names:
            return ""
        items = [item(name, properties[name]) for name in names]
        sep = json.dumps(separator) + " " if separator else ""
        memo: dict[tuple[int, bool], str] = {}

        def rest(index: int, first: bool) -> str:
            """The properties from ``index`` on, as a rule (``first``: none written before them)."""
            if index == len(names):
                return ""
            if (index, first) in memo:
                return memo[index, first]
            rule = self.fresh("args")
            memo[index, first] = rule
            written = f"{'' if first else sep}{items[index]} {rest(index + 1, False)}".strip()
            if names[index] in required:
                self.rules.append(f"{rule}: {written}")
            else:
                skipped = rest(index + 1, first)
                self.rules.append(f"{rule}: {written} | {skipped}" if skipped else f"{rule}: ({written})?")
            return rule

        return rest(0, True)


def _scalar(schema: Any, words: tuple[str, str, str], extra: dict[str, str] | None = None) -> str:
    """A value of ``schema``'s scalar type in a syntax that spells true, false and null as ``words``
    (anything else as JSON)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    true, false, null = words
    spelled = {
        "integer": "/-?(0|[1-9][0-9]{0,15})/",
        "number": r"/-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?/",
        "boolean": f"({json.dumps(true)} | {json.dumps(false)})",
        "null": json.dumps(null),
        **(extra or {}),
    }
    return spelled.get(kind if isinstance(kind, str) else "", "%json " + json.dumps(schema, ensure_ascii=False))


def _length(schema: Any) -> str:
    """A regular expression's repetition for a string schema's length bounds (``*`` without them)."""
    if not isinstance(schema, dict):
        return "*"
    low, high = schema.get("minLength"), schema.get("maxLength")
    low = low if isinstance(low, int) and not isinstance(low, bool) and low >= 0 else 0
    high = high if isinstance(high, int) and not isinstance(high, bool) and high >= low else None
    if high is None:
        return "*" if low == 0 else f"{{{low},}}"
    return f"{{{low},{high}}}"
