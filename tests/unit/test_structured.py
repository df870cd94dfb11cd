"""Structured output without a model: formats, the constraint on a byte-level toy vocabulary, tool dialects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from llmrun.decoding.assembler import Assembler
from llmrun.decoding.sampling import SamplingParams
from llmrun.errors import InvalidParameter, UsageError
from llmrun.prompt.template import Context, Message, ToolCall, render_text
from llmrun.structured import ANY_JSON, Format, from_schema, load_grammar, load_schema, response_format
from llmrun.structured.dialects import GENERIC, HERMES, LLAMA3, MISTRAL, dialect_for
from llmrun.structured.formats import declared_only
from llmrun.structured.generic import generic_messages
from llmrun.structured.grammar import Constraint, UnsupportedFormat, compile_format, format_notes
from llmrun.structured.tools import Tool, ToolUse

EOS = 256


class ToyVocabulary:
    """One token per byte, and an end-of-text token: every text has exactly one tokenization."""

    eos_token_id = EOS
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]
    special_token_ids = (EOS,)

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


@pytest.fixture(scope="module")
def toy() -> Any:
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ToyVocabulary()))


def allowed(constraint: Constraint) -> set[int]:
    flags = constraint.allowed()
    assert flags is not None
    return {int(i) for i in np.flatnonzero(flags)}


def drive(constraint: Constraint, choose: Any, limit: int = 400) -> bytes:
    """Decode under the constraint, choosing among the allowed tokens with ``choose``."""
    out = b""
    for _ in range(limit):
        options = sorted(allowed(constraint))
        token = choose(options)
        constraint.accept(token)
        if token == EOS:
            return out
        out += bytes([token])
    return out


# --- formats --------------------------------------------------------------------------------------


def test_openai_response_format_shapes() -> None:
    assert response_format({"type": "text"}) is None
    assert response_format({"type": "json_object"}) == ANY_JSON
    fmt = response_format({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}})
    assert fmt is not None and fmt.kind == "schema" and fmt.name == "p" and fmt.schema() == {"type": "object"}
    for bad, field in [
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}, "response_format.json_schema.schema"),
        ({"type": "json_object", "json_schema": {}}, "response_format.json_schema"),
        ("json", "response_format"),
    ]:
        with pytest.raises(InvalidParameter) as info:
            response_format(bad)
        assert info.value.name == field


def test_schema_from_text_or_file_and_grammar_by_syntax(tmp_path: Path) -> None:
    assert load_schema('{"type": "integer"}').schema() == {"type": "integer"}
    path = tmp_path / "s.json"
    path.write_text('{"type": "object", "properties": {"b": {}, "a": {}}}')
    assert list(load_schema(str(path)).schema()["properties"]) == ["b", "a"]  # order kept: it is generation order
    with pytest.raises(UsageError, match="does not exist"):
        load_schema(str(tmp_path / "missing.json"))
    with pytest.raises(UsageError, match="not valid JSON"):
        load_schema("{oops")
    gbnf, lark = tmp_path / "g.gbnf", tmp_path / "g.lark"
    gbnf.write_text('root ::= "yes" | "no"')
    lark.write_text('start: "yes" | "no"')
    assert load_grammar(gbnf).kind == "gbnf" and load_grammar(lark).kind == "lark"
    sniffed = tmp_path / "g.txt"
    sniffed.write_text('root ::= "a"')
    assert load_grammar(sniffed).kind == "gbnf"


def test_declared_only_closes_objects_that_say_nothing_of_others() -> None:
    schema = {
        "type": "object",
        "properties": {"properties": {"type": "object", "properties": {"x": {}}}, "open": {"additionalProperties": {}}},
        "$defs": {"d": {"properties": {"y": {}}}},
    }
    closed = declared_only(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False  # a property named "properties"
    assert closed["properties"]["open"] == {"additionalProperties": {}}
    assert closed["$defs"]["d"]["additionalProperties"] is False
    combined = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert declared_only(combined) == combined  # closing each part would forbid the other's properties
    assert declared_only({"type": "array", "uniqueItems": False}) == {"type": "array"}  # asks nothing
    compile_format(from_schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": False}))


def test_a_keyword_the_engine_cannot_enforce_is_named_not_ignored() -> None:
    for keyword, schema in [("not", {"not": {"type": "string"}}), ("uniqueItems", {"uniqueItems": True})]:
        with pytest.raises(UnsupportedFormat, match=keyword) as info:
            compile_format(from_schema(schema))
        assert info.value.exit_code == 2
    with pytest.raises(UnsupportedFormat, match="does not exist"):
        compile_format(from_schema({"$ref": "#/$defs/missing"}))
    with pytest.raises(UnsupportedFormat, match="grammar"):
        compile_format(Format("lark", "start: ("))


def test_an_unknown_format_is_an_annotation_named_in_a_note(toy: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "home": {"type": "string", "format": "url", "maxLength": 20},
            "file": {"type": "string", "format": "path", "maxLength": 20},
            "day": {"type": "string", "format": "date"},  # one llguidance knows: still enforced
            "format": {"type": "string", "maxLength": 5},  # a property named format is not a keyword
        },
        "required": ["home", "file", "day", "format"],
    }
    fmt = from_schema(schema)
    notes = format_notes(fmt)
    assert len(notes) == 2 and "format: url" in notes[0] and "format: path" in notes[1]
    assert "date" not in " ".join(notes)
    text = drive(Constraint(toy, fmt), lambda options: options[len(options) // 2])
    document = json.loads(text)
    jsonschema.validate(document, schema)
    assert len(document["day"]) == 10 and document["day"][4] == "-"  # a date, as enforced


def test_one_of_is_enforced_as_any_of_and_checked_as_written(toy: Any) -> None:
    schema = {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}
    fmt = from_schema(schema)
    assert any("oneOf" in note for note in format_notes(fmt))

    def valid(answer: bytes) -> bool | None:
        assembler = Assembler(
            lambda t: bytes([t]),
            lambda t: t == EOS,
            prompt_tokens=1,
            n_ctx=64,
            params=SamplingParams(temperature=0, max_tokens=20),
            seed=None,
            constraint=Constraint(toy, fmt),
        )
        for token in [*answer, EOS]:
            assembler.push(token)
        return assembler.close()[1].stats.valid

    assert valid(b"-3") is True  # an integer below 0: one branch
    assert valid(b"2.5") is True  # a positive non-integer: the other
    assert valid(b"5") is False  # both branches: not oneOf, though anyOf allowed it
    assert format_notes(from_schema({"type": "string"})) == ()


# --- the constraint -----------------------------------------------------------------------------------


def test_the_mask_allows_only_what_continues_the_schema_and_the_end_only_when_complete(toy: Any) -> None:
    constraint = Constraint(toy, from_schema({"enum": ["ab", "ac"]}))
    assert allowed(constraint) == {ord('"')}
    for token in b'"a':
        constraint.accept(token)
    assert allowed(constraint) == {ord("b"), ord("c")}
    assert not constraint.complete
    constraint.accept(ord("c"))
    constraint.accept(ord('"'))
    assert constraint.complete and constraint.finished
    assert allowed(constraint) == {EOS}


def test_masking_logits_in_place_leaves_allowed_values_alone(toy: Any) -> None:
    constraint = Constraint(toy, from_schema({"type": "boolean"}))
    logits = np.arange(300, dtype=np.float32)  # an output layer wider than the vocabulary
    constraint.mask(logits)
    assert set(np.flatnonzero(np.isfinite(logits))) == {ord("t"), ord("f")}
    assert logits[ord("t")] == ord("t")


@pytest.mark.parametrize("seed", range(5))
def test_any_choice_among_allowed_tokens_gives_a_valid_document(toy: Any, seed: int) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 3},
            "n": {"type": "integer", "minimum": -5, "maximum": 5},
            "ok": {"const": '한국어 👋 "quoted"'},
        },
        "required": ["name", "tags", "n", "ok"],
    }
    rng = np.random.default_rng(seed)
    constraint = Constraint(toy, from_schema(schema))
    # random choices, but prefer the end when it is allowed (a random walk may otherwise never stop)
    text = drive(constraint, lambda options: EOS if EOS in options else int(rng.choice(options)))
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert value["ok"] == '한국어 👋 "quoted"'


def test_follow_accepts_what_a_logits_processor_sees_appended(toy: Any) -> None:
    constraint = Constraint(toy, ANY_JSON)
    context = [7, 7]  # the prompt
    constraint.follow(context)  # before the first token: nothing generated yet
    assert constraint.accepted == 0
    for token in b"[1]":
        context.append(token)
        constraint.follow(context)
    assert constraint.accepted == 3 and constraint.complete


def test_the_assembler_reports_a_cut_answer_as_not_valid(toy: Any) -> None:
    def assembler(max_tokens: int) -> Assembler:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        constraint = Constraint(toy, from_schema({"type": "array", "items": {"type": "integer"}}))
        return Assembler(
            lambda t: bytes([t]),
            lambda t: t == EOS,
            prompt_tokens=1,
            n_ctx=64,
            params=params,
            seed=None,
            constraint=constraint,
        )

    whole = assembler(10)
    for token in [*b"[12]", EOS]:
        whole.push(token)
    assert whole.close()[1].stats.valid is True
    cut = assembler(3)
    for token in b"[12":
        cut.push(token)
    done = cut.close()[1]
    assert done.stats.finish_reason == "length" and done.stats.valid is False
    number = Assembler(
        lambda t: bytes([t]),
        lambda t: t == EOS,
        prompt_tokens=1,
        n_ctx=64,
        params=SamplingParams(max_tokens=2),
        seed=None,
        constraint=Constraint(toy, ANY_JSON),
    )
    for token in b"12":
        number.push(token)
    assert number.close()[1].stats.valid is False  # "12" parses, but the model was not done (123…)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "items": {"type": "string"}},
        {
            "type": "object",
            "properties": {"notes": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["notes", "n"],
        },
        {"type": "array", "items": {"type": "array", "items": {"type": "number"}}, "minItems": 2},
    ],
)
def test_a_json_answer_near_the_end_of_its_budget_is_steered_to_finish(toy: Any, schema: dict[str, Any]) -> None:
    """A "model" that would write forever (always the letter a, a digit, or an opening bracket, where the
    grammar allows) still ends with a whole, valid document within its budget; without a budget it
    never ends."""
    budget = 60
    fmt = from_schema(schema)

    def answer(with_budget: bool) -> tuple[bytes, bool | None, int]:
        constraint = Constraint(toy, fmt)
        assembler = Assembler(
            lambda t: bytes([t]),
            lambda t: t == EOS,
            prompt_tokens=1,
            n_ctx=4096,
            params=SamplingParams(temperature=0, max_tokens=budget),
            seed=None,
            constraint=constraint,
        )
        if not with_budget:
            constraint.budget = None
        text = b""
        while assembler.finish is None:
            options = allowed(constraint)
            token = next((t for t in b'a7[{"n' if t in options), min(options))  # rambling, where allowed
            constraint.accept(token)  # (as a backend does, before the assembler counts it)
            assembler.push(token)
            text += bytes([token]) if token != EOS else b""
        return text, assembler.close()[1].stats.valid, constraint.steered

    text, valid, steered = answer(with_budget=True)
    assert valid is True and steered > 0 and len(text) < budget, text
    jsonschema.validate(json.loads(text), schema)
    cut, valid, _ = answer(with_budget=False)
    assert valid is False and len(cut) == budget  # cut at max_tokens: what the steering prevents


# --- tools ------------------------------------------------------------------------------------------

WEATHER = Tool(
    "get_weather",
    "Weather now",
    json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
ADD = Tool(
    "add", "", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})
)


def test_dialect_by_template() -> None:
    assert dialect_for("{% if tools %}<tool_call>{{ tools }}</tool_call>{% endif %}") is HERMES
    assert dialect_for("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]") is MISTRAL
    assert dialect_for("<|start_header_id|>ipython<|end_header_id|><|python_tag|>{{ tools }}") is LLAMA3
    assert dialect_for("<start_of_turn>{{ messages }}") is GENERIC


@pytest.mark.parametrize(
    ("dialect", "text", "content", "calls"),
    [
        (
            HERMES,
            '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
            None,
            [("add", {"a": 1, "b": 2})],
        ),
        (
            HERMES,
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>',
            "Let me check.",
            [("get_weather", {"city": "Oslo"}), ("add", {})],
        ),
        (HERMES, "Just text.", "Just text.", []),
        (LLAMA3, '<|python_tag|>{"name": "add", "parameters": {"a": 1}}', None, [("add", {"a": 1})]),
        (LLAMA3, "It is sunny.", "It is sunny.", []),
        (
            MISTRAL,
            '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "add", "arguments": {"b": 2}}]',
            None,
            [("add", {"a": 1}), ("add", {"b": 2})],
        ),
        (
            MISTRAL,
            '[{"name": "add", "arguments": {"a": 1}}]',
            None,
            [("add", {"a": 1})],
        ),  # the marker is a control token
        (
            GENERIC,
            '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}',
            None,
            [("get_weather", {"city": "Oslo"})],
        ),
        (GENERIC, '{"response": "Hello"}', "Hello", []),
    ],
)
def test_reading_calls_back(dialect: Any, text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    got_content, got_calls = dialect.parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls
    assert len({c.id for c in got_calls}) == len(got_calls)
    if dialect is MISTRAL:
        assert all(len(c.id) == 9 and c.id.isalnum() for c in got_calls)


@pytest.mark.parametrize("dialect", [HERMES, LLAMA3, MISTRAL, GENERIC])
@pytest.mark.parametrize("mode", ["auto", "required", "function", "none"])
def test_every_dialect_grammar_compiles(dialect: Any, mode: str) -> None:
    use = ToolUse((WEATHER, ADD), mode, "add" if mode == "function" else None)  # type: ignore[arg-type]
    compile_format(dialect.format(use, lambda text: json.dumps(text)))


@pytest.mark.parametrize("dialect", [HERMES, MISTRAL, GENERIC])
def test_required_calls_come_out_as_calls_that_match_their_parameters(toy: Any, dialect: Any) -> None:
    use = ToolUse((WEATHER, ADD), "required")
    rng = np.random.default_rng(3)
    for _ in range(3):
        constraint = Constraint(toy, dialect.format(use, lambda text: json.dumps(text)))
        text = drive(constraint, lambda options: EOS if EOS in options else int(rng.choice(options)), 2000).decode()
        _, calls = dialect.parse(text)
        assert calls, text
        for call in calls:
            tool = {t.name: t for t in (WEATHER, ADD)}[call.name]
            jsonschema.validate(json.loads(call.arguments), json.loads(tool.parameters))


def test_a_named_function_is_the_only_call_possible(toy: Any) -> None:
    use = ToolUse((WEATHER, ADD), "function", "add")
    constraint = Constraint(toy, GENERIC.format(use, json.dumps))
    text = drive(constraint, lambda options: EOS if EOS in options else options[-1], 2000).decode()
    _, calls = GENERIC.parse(text)
    assert [c.name for c in calls] == ["add"]


def test_auto_text_cannot_begin_a_call_it_does_not_finish(toy: Any) -> None:
    constraint = Constraint(toy, HERMES.format(ToolUse((ADD,), "auto"), json.dumps))
    for token in b"<tool_call>\n":
        constraint.accept(token)
    assert not constraint.failed
    assert allowed(constraint) == {ord("{")}  # once the marker is written, a call it is


def test_tool_choice_none_answers_in_text(toy: Any) -> None:
    use = ToolUse((WEATHER, ADD), "none")
    generic = Constraint(toy, GENERIC.format(use, json.dumps))
    shortest = lambda options: EOS if EOS in options else 34 if 34 in options else min(options)  # noqa: E731
    text = drive(generic, shortest, 400).decode()
    assert GENERIC.parse(text) == ("", ()) and set(json.loads(text)) == {"response"}
    hermes = Constraint(toy, HERMES.format(use, json.dumps))
    for token in b"<tool_call>":
        hermes.accept(token)
    assert hermes.failed  # text may not begin a call


def test_generic_conversation_describes_tools_and_keeps_turns_alternating() -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')
    messages = [
        Message("system", "Be brief."),
        Message("user", "Weather in Oslo and Bergen?"),
        Message("assistant", "", tool_calls=(call, ToolCall("call_2", "get_weather", '{"city": "Bergen"}'))),
        Message("tool", "12 C", tool_call_id="call_1"),
        Message("tool", "9 C", tool_call_id="call_2"),
    ]
    out = generic_messages(messages, ToolUse((WEATHER,)))
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]
    assert out[0].content.startswith("Be brief.") and "get_weather" in out[0].content
    assert json.loads(out[2].content) == {
        "tool_calls": [
            {"name": "get_weather", "arguments": {"city": "Oslo"}},
            {"name": "get_weather", "arguments": {"city": "Bergen"}},
        ]
    }
    results = [json.loads(line)["tool_response"] for line in out[3].content.splitlines()]
    assert results == [
        {"name": "get_weather", "tool_call_id": "call_1", "content": "12 C"},
        {"name": "get_weather", "tool_call_id": "call_2", "content": "9 C"},
    ]


def test_templates_see_tools_and_calls_as_huggingface_passes_them() -> None:
    template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}{{ m.role }}:"
        "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | tojson }}"
        "{% endfor %}{% else %}{{ m.content }}{% endif %}"
        "{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}\n{% endfor %}"
    )
    call = ToolCall("c1", "add", '{"a": 1}')
    text = render_text(
        template,
        [Message("user", "sum"), Message("assistant", "", (call,)), Message("tool", "1", tool_call_id="c1")],
        Context(tools=(ADD.openai(),)),
    )
    assert text == 'TOOLS:add;user:sumassistant:add{"a": 1}tool:1#c1'  # (trim_blocks eats the newlines)


def test_a_run_of_digits_ends_where_the_grammar_lets_it(toy: Any) -> None:
    number = Constraint(toy, from_schema({"type": "number"}))
    zeros = Constraint(toy, from_schema({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}))
    for constraint, start in ((number, b"1"), (zeros, b"0.")):
        for token in start:
            constraint.accept(token)
        greedy_zero = lambda options: ord("0") if ord("0") in options else EOS if EOS in options else min(options)  # noqa: E731
        text = start + drive(constraint, greedy_zero, 60)
        assert len(text) <= 20, text  # a greedy "0" forever would never end
        value = json.loads(text)
        assert value > 0


def streamed(dialect: Any, text: str, step: int = 1) -> tuple[str, str]:
    from llmrun.structured.textstream import TextStream

    stream = TextStream(dialect)
    shown = "".join(stream.feed(text[i : i + step]) for i in range(0, len(text), step))
    return shown, stream.state


@pytest.mark.parametrize("step", [1, 2, 5])
def test_text_streams_once_it_cannot_be_a_call(step: int) -> None:
    assert streamed(HERMES, "  Hello <b>there</b>", step) == ("  Hello <b>there</b>", "text")
    assert streamed(HERMES, '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>', step)[0] == ""
    assert streamed(LLAMA3, '{"name": "add", "parameters": {}}', step) == ("", "calls")
    assert streamed(MISTRAL, '[{"name": "add", "arguments": {}}]', step) == ("", "calls")
    assert streamed(MISTRAL, "[1] is a footnote", step) == ("[1] is a footnote", "text")
    answer = json.dumps({"response": 'Tab\t, "quote", 한국어 👋 \\ \u00e9'}, ensure_ascii=True)  # \uXXXX, surrogates
    shown, state = streamed(GENERIC, answer, step)
    assert (shown, state) == ('Tab\t, "quote", 한국어 👋 \\ \u00e9', "done")
    assert streamed(GENERIC, '{"tool_calls": [{"name": "add", "arguments": {}}]}', step) == ("", "calls")


@pytest.mark.parametrize("dialect", [HERMES, LLAMA3, MISTRAL, GENERIC])
def test_tools_beside_a_response_format_answer_calls_or_that_json(toy: Any, dialect: Any) -> None:
    answer = from_schema({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    fmt = dialect.format(ToolUse((ADD,), "auto"), json.dumps, answer)
    compile_format(fmt)
    constraint = Constraint(toy, fmt)
    prefix = b'{"response": ' if dialect is GENERIC else b""
    for token in prefix + b'{"ok": tr':
        constraint.accept(token)
    assert not constraint.failed
    for token in b"ue}" + (b"}" if dialect is GENERIC else b""):
        constraint.accept(token)
    assert constraint.complete
    text = (prefix + b'{"ok": true}' + (b"}" if dialect is GENERIC else b"")).decode()
    content, calls = dialect.parse(text)
    assert calls == () and json.loads(content or "") == {"ok": True}
    with pytest.raises(UsageError, match="must be JSON"):
        dialect.format(ToolUse((ADD,), "auto"), json.dumps, Format("lark", 'start: "x"'))
