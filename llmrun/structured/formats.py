"""What an answer must look like: any JSON value, a JSON Schema, or a grammar (pure; no engine imported).

Every adapter builds one :class:`Format`: the CLI from ``--format json``, ``--schema FILE|JSON`` or
``--grammar FILE``; a batch line and the server from OpenAI's ``response_format``. The constrained
decoder (:mod:`llmrun.structured.grammar`) turns it into a token mask at every step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llmrun.errors import InvalidParameter, UsageError

Kind = Literal["json", "schema", "lark", "gbnf"]
MAX_SOURCE = 256_000  # bytes of schema or grammar text: a bound on what a client can make us compile


@dataclass(frozen=True, slots=True)
class Format:
    """``json``: any JSON value (OpenAI's ``json_object``); ``schema``: a JSON Schema (``text`` is it, as
    JSON); ``lark``/``gbnf``: a grammar in that syntax. ``name`` is the schema's name (OpenAI's
    ``json_schema.name``), shown nowhere but kept for the response."""

    kind: Kind
    text: str = ""
    name: str | None = None

    @property
    def is_json(self) -> bool:
        """Whether a complete answer is a JSON document (then it is parsed into ``parsed``)."""
        return self.kind in ("json", "schema")

    def schema(self) -> Any:
        """The JSON Schema this format enforces (``{}`` — any value — for ``json``)."""
        if self.kind == "json":
            return {}
        if self.kind == "schema":
            return json.loads(self.text)
        raise ValueError(f"a {self.kind} grammar has no JSON Schema")


ANY_JSON = Format("json")


def from_schema(schema: Any, name: str | None = None, *, parameter: str = "schema") -> Format:
    """A Format enforcing ``schema`` (a JSON object, or ``true``/``false`` as JSON Schema allows)."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise InvalidParameter(parameter, _short(schema), "a JSON Schema (a JSON object)")
    text = json.dumps(schema, ensure_ascii=False)  # key order kept: properties are generated in it
    if len(text.encode("utf-8")) > MAX_SOURCE:
        raise InvalidParameter(parameter, f"{len(text)} characters", f"at most {MAX_SOURCE} bytes")
    return Format("schema", text, name)


def parse_schema_text(text: str, *, parameter: str = "schema") -> Format:
    """A JSON Schema given as JSON text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"`{parameter}` is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            f"give `{parameter}` a JSON Schema, as a file or as JSON text",
        ) from None
    return from_schema(value, parameter=parameter)


def load_schema(value: str) -> Format:
    """``--schema``'s value: a file holding a JSON Schema, or the schema itself as JSON text."""
    stripped = value.strip()
    if stripped.startswith(("{", "[")) or stripped in ("true", "false"):
        return parse_schema_text(stripped)
    return parse_schema_text(_read(Path(value), "schema"))


def load_grammar(path: Path) -> Format:
    """``--grammar FILE``: a Lark grammar (llguidance's dialect), or GBNF (llama.cpp's) — by the file's
    extension (``.lark``, ``.gbnf``), else by its rules (``::=`` is GBNF's)."""
    text = _read(path, "grammar")
    if not text.strip():
        raise UsageError(f"`grammar` file {path} is empty", "give a Lark or GBNF grammar")
    suffix = path.suffix.lower()
    kind: Kind = "gbnf" if suffix == ".gbnf" or (suffix != ".lark" and "::=" in text) else "lark"
    return Format(kind, text)


def response_format(value: Any, parameter: str = "response_format") -> Format | None:
    """OpenAI's ``response_format`` object: ``text`` (None: no constraint), ``json_object``, or
    ``json_schema`` with ``{"name", "schema", "strict", "description"}``."""
    if not isinstance(value, dict):
        raise InvalidParameter(parameter, _short(value), 'an object such as {"type": "json_object"}')
    kind = value.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if not isinstance(kind, str) or kind not in allowed:
        raise InvalidParameter(f"{parameter}.type", _short(kind), "text, json_object or json_schema")
    unknown = set(value) - allowed[kind]
    if unknown:
        raise InvalidParameter(f"{parameter}.{sorted(unknown)[0]}", "given", f"absent for type {kind}")
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_JSON
    spec = value.get("json_schema")
    where = f"{parameter}.json_schema"
    if not isinstance(spec, dict):
        raise InvalidParameter(where, _short(spec), 'an object with "name" and "schema"')
    extra = set(spec) - {"name", "schema", "strict", "description"}
    if extra:
        raise InvalidParameter(f"{where}.{sorted(extra)[0]}", "given", "one of name, schema, strict, description")
    name = spec.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidParameter(f"{where}.name", _short(name), "a name of 1 to 64 characters")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidParameter(f"{where}.strict", _short(strict), "a boolean")
    # strict or not, llmrun enforces the schema while decoding: the answer always matches it
    return from_schema(spec.get("schema", {}), name, parameter=f"{where}.schema")


OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def declared_only(schema: Any, annotations: frozenset[str] = frozenset()) -> Any:
    """``schema`` as it is enforced: each object that lists ``properties`` and says nothing about
    others closed to them (``additionalProperties: false``), as OpenAI's strict mode requires, and
    ``uniqueItems: false`` (which asks nothing) dropped. Every answer valid under the result is valid
    under ``schema``: a small model otherwise invents keys until ``max_tokens``. With ``allOf``
    anywhere no object is closed (its parts' properties are combined). A ``format`` named in
    ``annotations`` is dropped: one the decoder does not know, which JSON Schema treats as an annotation."""
    return _close(schema, not _mentions(schema, "allOf"), annotations)


def conforms(fmt: Format, text: str) -> bool:
    """Whether ``text`` is a JSON document valid under ``fmt``'s schema as written, by the reference
    validator (``jsonschema``; formats are annotations, as its default is). It checks what decoding
    only approximates (``oneOf``'s "exactly one"); a schema it cannot read leaves the decoder's word."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if fmt.kind != "schema":
        return True
    from jsonschema import exceptions, validators
    from referencing.exceptions import Unresolvable

    schema = fmt.schema()
    try:
        return bool(validators.validator_for(schema)(schema).is_valid(value))
    except (exceptions.SchemaError, Unresolvable, RecursionError):
        return True


SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
SCHEMA_ONES = ("items", "additionalProperties", "contains", "not", "if", "then", "else", "propertyNames")


def _close(node: Any, close: bool, annotations: frozenset[str] = frozenset()) -> Any:
    """One schema prepared, with the schemas it holds (by keyword: a property may be named anything)."""
    if not isinstance(node, dict):
        return node
    closed = dict(node)
    for key in SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            closed[key] = {name: _close(value, close, annotations) for name, value in node[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            closed[key] = [_close(value, close, annotations) for value in node[key]]
    for key in SCHEMA_ONES:
        if key in node:
            value = node[key]
            closed[key] = (
                [_close(v, close, annotations) for v in value]
                if isinstance(value, list)
                else _close(value, close, annotations)
            )
    if isinstance(node.get("allOf"), list):
        closed["allOf"] = [_close(value, close, annotations) for value in node["allOf"]]
    if node.get("uniqueItems") is False:
        del closed["uniqueItems"]
    if isinstance(node.get("format"), str) and node["format"] in annotations:
        del closed["format"]
    if close and isinstance(node.get("properties"), dict) and not any(key in node for key in OPEN_KEYWORDS):
        closed["additionalProperties"] = False
    return closed


def _mentions(node: Any, keyword: str) -> bool:
    if isinstance(node, dict):
        return keyword in node or any(_mentions(value, keyword) for value in node.values())
    if isinstance(node, list):
        return any(_mentions(item, keyword) for item in node)
    return False


def _read(path: Path, parameter: str) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_SOURCE:
            raise UsageError(f"`{parameter}` file {path} is {size} bytes", f"keep it under {MAX_SOURCE} bytes")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(
            f"`{parameter}` file {path} does not exist", f"give `{parameter}` a file path, or the text itself"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read `{parameter}` file {path}: {exc}", "give a readable UTF-8 text file") from None


def _short(value: Any) -> Any:
    text = repr(value)
    return value if len(text) <= 60 else text[:57] + "..."
