"""Structured output on the real models: every answer parses and matches its schema (checked by the
reference validator, jsonschema) at several temperatures and seeds, on GGUF (one sequence and batched)
and MLX; the CLI's --format / --schema / --grammar; batch lines with their own schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from llmrun.backends.base import LoadParams
from llmrun.backends.gguf import GgufBackend, GgufModel
from llmrun.backends.mlx import MlxBackend, MlxModel
from llmrun.decoding.events import BatchRequest, Done
from llmrun.decoding.sampling import SamplingParams
from llmrun.structured import ANY_JSON, from_schema
from llmrun.structured.grammar import constraint_for
from tests.support.helpers import invoke

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,10}@example\\.com$"},
    },
    "required": ["name", "age"],
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested objects, optional properties": {
        "type": "object",
        "properties": {
            "person": PERSON,
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city"],
            },
        },
        "required": ["person", "address"],
    },
    "arrays with minItems and maxItems, enum, const": {
        "type": "object",
        "properties": {
            "kind": {"const": "inventory"},
            "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 2, "maxItems": 4},
            "sizes": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "maxItems": 3},
        },
        "required": ["kind", "colours", "sizes"],
        "additionalProperties": False,
    },
    "numbers with bounds, string formats": {
        "type": "object",
        "properties": {
            "price": {"type": "number", "minimum": 0, "maximum": 1000},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "day": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "in_stock": {"type": "boolean"},
        },
        "required": ["price", "ratio", "day", "id", "in_stock"],
    },
    "$ref and $defs, anyOf, oneOf": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -99, "maximum": 99},
                    "y": {"type": "integer", "minimum": -99, "maximum": 99},
                },
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {
            "start": {"$ref": "#/$defs/point"},
            "end": {"$ref": "#/$defs/point"},
            "label": {"anyOf": [{"type": "string", "maxLength": 12}, {"type": "null"}]},
            "shape": {
                "oneOf": [
                    {"const": "line"},
                    {
                        "type": "object",
                        "properties": {"radius": {"type": "integer", "minimum": 1, "maximum": 9}},
                        "required": ["radius"],
                    },
                ]
            },
        },
        "required": ["start", "end", "label", "shape"],
        "additionalProperties": False,
    },
    "Korean, emoji and escapes inside strings": {
        "type": "object",
        "properties": {
            "greeting": {"enum": ["안녕하세요 👋", "こんにちは 🎌", "Grüß dich ☕"]},
            "escaped": {"const": 'tab\t"quote" back\\slash\nline'},
        },
        "required": ["greeting", "escaped"],
    },
}
SETTINGS = [SamplingParams(temperature=0, max_tokens=300)] + [
    SamplingParams(temperature=t, seed=s, max_tokens=300) for t, s in [(0.8, 1), (0.8, 2), (1.3, 3)]
]
PROMPT = "Fill in this record as JSON.\n"


def check(schema: dict[str, Any], done: Done, where: str) -> None:
    assert done.stats.valid is True, f"{where}: {done.stats.finish_reason}: {done.text!r}"
    assert done.stats.finish_reason == "eos", where
    assert "\ufffd" not in done.text, where
    jsonschema.validate(json.loads(done.text), schema)


@pytest.fixture(scope="module")
def gguf(gemma_cache: Path) -> Iterator[GgufModel]:
    model = GgufBackend().load(gemma_cache, LoadParams(2048, 2, 0))
    yield model
    model.close()


def test_every_schema_at_every_setting_batched(gguf: GgufModel) -> None:
    from llmrun.backends import gguf_batch

    ids = gguf.tokenize(PROMPT, add_bos=True)
    cases = [(name, params) for name in SCHEMAS for params in SETTINGS]
    requests = [
        BatchRequest(i, ids, params, constraint_for(gguf, from_schema(SCHEMAS[name])))
        for i, (name, params) in enumerate(cases)
    ]
    outcomes = {o.index: o for o in gguf_batch.generate(gguf, requests, 8, 512)}
    for i, (name, params) in enumerate(cases):
        done = outcomes[i].done
        assert done is not None, outcomes[i].error
        check(SCHEMAS[name], done, f"{name} at T={params.temperature} seed={params.seed}")
    greetings = {
        json.loads(outcomes[i].done.text)["greeting"] for i, (n, _) in enumerate(cases) if n.startswith("Korean")
    }  # type: ignore[union-attr]
    assert greetings <= set(SCHEMAS["Korean, emoji and escapes inside strings"]["properties"]["greeting"]["enum"])


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_one_sequence_at_a_time_with_sampling(gguf: GgufModel, name: str) -> None:
    ids = gguf.tokenize(PROMPT, add_bos=True)
    for params in (SETTINGS[0], SETTINGS[3]):
        events = list(gguf.stream(ids, params, constraint=constraint_for(gguf, from_schema(SCHEMAS[name]))))
        done = events[-1]
        assert isinstance(done, Done)
        check(SCHEMAS[name], done, f"{name} at T={params.temperature}")
        assert "".join(e.text for e in events[:-1]) == done.text  # streamed as it is returned


def test_a_cut_answer_is_never_called_valid(gguf: GgufModel) -> None:
    ids = gguf.tokenize(PROMPT, add_bos=True)
    events = list(
        gguf.stream(
            ids, SamplingParams(temperature=0, max_tokens=4), constraint=constraint_for(gguf, from_schema(PERSON))
        )
    )
    done = events[-1]
    assert isinstance(done, Done)
    assert done.stats.finish_reason == "length" and done.stats.valid is False
    with pytest.raises(json.JSONDecodeError):
        json.loads(done.text)


def test_any_json_at_high_temperature(gguf: GgufModel) -> None:
    ids = gguf.tokenize("A JSON list of three fruits: ", add_bos=True)
    for seed in range(3):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=300)
        done = list(gguf.stream(ids, params, constraint=constraint_for(gguf, ANY_JSON)))[-1]
        assert isinstance(done, Done)
        if done.stats.valid:
            json.loads(done.text)
        else:  # a JSON number or string may run to max_tokens; then it is said, not hidden
            assert done.stats.finish_reason == "length"


@pytest.fixture(scope="module")
def mlx(gemma_mlx16: Path) -> Iterator[MlxModel]:
    model = MlxBackend().load(gemma_mlx16, LoadParams(1024, 2, 0))
    yield model
    model.close()


def test_mlx_one_sequence_and_batched(mlx: MlxModel) -> None:
    schema = SCHEMAS["arrays with minItems and maxItems, enum, const"]
    ids = mlx.tokenize(PROMPT, add_bos=True)
    for params in (SETTINGS[0], SETTINGS[1]):
        done = list(mlx.stream(ids, params, constraint=constraint_for(mlx, from_schema(schema))))[-1]
        assert isinstance(done, Done)
        check(schema, done, f"mlx T={params.temperature}")
    korean = SCHEMAS["Korean, emoji and escapes inside strings"]
    requests = [
        BatchRequest(i, ids, params, constraint_for(mlx, from_schema(s)))
        for i, (s, params) in enumerate([(schema, SETTINGS[2]), (korean, SETTINGS[3])])
    ]
    decoder = mlx.batch_decoder(2, 512)
    assert decoder is not None
    for request in requests:
        assert decoder.admit(request) is None
    finished: dict[int, Done] = {}
    try:
        while decoder.active:
            finished.update((i, e) for i, e in decoder.step() if isinstance(e, Done))
    finally:
        decoder.close()
    check(schema, finished[0], "mlx batched")
    check(korean, finished[1], "mlx batched, Korean")


# --- the CLI ---------------------------------------------------------------------------------------


def test_run_format_json_and_schema_with_json_envelope(gemma: Path, tmp_path: Path) -> None:
    code, out, err = invoke(["run", "--format", "json", "-t", "0", "-n", "200", "A JSON object describing a cat:"])
    assert code == 0, err
    json.loads(out)
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(PERSON))
    code, out, err = invoke(["run", "--schema", str(schema_file), "--json", "-t", "0.7", "--seed", "5", PROMPT])
    assert code == 0, err
    report = json.loads(out)
    assert report["valid"] is True and report["format"] == "schema"
    assert report["parsed"] == json.loads(report["text"])
    jsonschema.validate(report["parsed"], PERSON)


def test_run_reports_a_cut_answer_and_exits_non_zero(gemma: Path) -> None:
    code, out, err = invoke(["run", "--schema", json.dumps(PERSON), "--json", "-t", "0", "-n", "3", PROMPT])
    assert code == 1
    report = json.loads(out)
    assert report["valid"] is False and report["stop_reason"] == "length" and "parsed" not in report
    assert "not complete JSON" in err and "--max-tokens" in err


def test_an_answer_near_its_budget_finishes_instead_of_being_cut(gemma: Path) -> None:
    """Unbounded strings and lists: given room, the greedy answer goes on far past 96 tokens (in its
    description or its tags, depending on how this CPU's kernels round near-ties); with a budget of 96,
    steered in its last 24, it closes and ends valid."""
    schema = {
        "type": "object",
        "properties": {"description": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["description", "tags"],
    }

    def answer(budget: int) -> dict[str, Any]:
        args = ["run", "--schema", json.dumps(schema), "--json", "-t", "0", "-n", str(budget)]
        code, out, err = invoke([*args, "Describe the sea in JSON:"])
        assert code in (0, 1), err
        return dict(json.loads(out))

    free = answer(400)
    assert free["tokens"]["generated"] > 96  # left alone, the answer would not end within the budget below
    report = answer(96)
    assert report["valid"] is True and report["stop_reason"] == "eos" and report["tokens"]["generated"] <= 96
    jsonschema.validate(report["parsed"], schema)
    assert report["text"][:40] == free["text"][:40]  # the same answer, closed early rather than another one


def test_an_unknown_format_is_noted_and_the_answer_checked_as_written(gemma: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"site": {"type": "string", "format": "url", "maxLength": 30}},
        "required": ["site"],
    }
    code, out, err = invoke(["run", "--schema", json.dumps(schema), "--json", "-t", "0", "-n", "64", PROMPT])
    assert code == 0, err
    assert "format: url" in err and "annotation" in err
    report = json.loads(out)
    assert report["valid"] is True
    jsonschema.validate(report["parsed"], schema)


def test_a_keyword_that_cannot_be_enforced_is_refused_before_loading(tmp_path: Path) -> None:
    code, out, err = invoke(["run", "--schema", '{"type": "array", "uniqueItems": true}', "hi"])
    assert code == 2 and out == ""
    assert "uniqueItems" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("name", "text"),
    [("yes.gbnf", 'root ::= ("yes" | "no") "!"'), ("yes.lark", 'start: ("yes" | "no") "!"')],
)
def test_run_with_a_grammar_file(gemma: Path, tmp_path: Path, name: str, text: str) -> None:
    grammar = tmp_path / name
    grammar.write_text(text)
    code, out, err = invoke(["run", "--grammar", str(grammar), "-t", "1", "--seed", "4", "Is water wet?"])
    assert code == 0, err
    assert out.strip() in ("yes!", "no!")


def test_batch_lines_with_different_schemas_in_one_run(gemma: Path, tmp_path: Path) -> None:
    colour = {"enum": ["red", "green", "blue"]}
    lines = [
        {"id": "person", "prompt": PROMPT, "schema": PERSON, "temperature": 0.9, "seed": 2},
        {
            "id": "colour",
            "prompt": "A colour:",
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": colour}},
        },
        {"id": "any", "prompt": "A JSON list of two numbers:", "response_format": {"type": "json_object"}},
        {"id": "plain", "prompt": "Hello"},
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    code, out, err = invoke(["batch", str(source), "-t", "0", "-n", "120", "--parallel", "4"])
    assert code == 0, err
    records = {r["id"]: r for r in map(json.loads, out.splitlines())}
    jsonschema.validate(records["person"]["parsed"], PERSON)
    assert records["colour"]["parsed"] in colour["enum"]
    assert records["any"]["valid"] is True and records["any"]["format"] == "json"
    assert "format" not in records["plain"]


def test_chat_model_answers_in_schema_through_its_template(smollm: Path, gemma: Path) -> None:
    for seed in (1, 2, 3):
        code, out, err = invoke(
            [
                "run",
                "-m",
                str(smollm),
                "--schema",
                json.dumps(PERSON),
                "--json",
                "-t",
                "0.8",
                "--seed",
                str(seed),
                "Invent a person.",
            ]
        )
        assert code == 0, err
        report = json.loads(out)
        assert report["prompt_format"] == "chat template"
        jsonschema.validate(report["parsed"], PERSON)


def test_chat_set_schema(smollm: Path, gemma: Path, tmp_path: Path) -> None:
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(PERSON))
    script = f"/set schema {schema_file}\nInvent a person.\n/set format off\n/show params\n"
    code, out, err = invoke(["chat", "-m", str(smollm), "-t", "0", "-n", "200"], stdin=script)
    assert code == 0, err
    answer = next(line for line in out.splitlines() if line.startswith("{"))
    jsonschema.validate(json.loads(answer), PERSON)
    assert "format             'off'" in out


def test_markers_are_the_vocabulary_s_special_tokens_when_it_has_them(smollm: Path) -> None:
    """ChatML's <|im_start|> is a special token of SmolLM2's vocabulary; <tool_call> is not: a grammar
    names the first by id (text cannot produce it) and the second as text."""
    from llmrun.structured.formats import Format
    from llmrun.structured.grammar import marker_for

    model = GgufBackend().load(smollm, LoadParams(512, 2, 0))
    try:
        marker = marker_for(model)
        start = model.tokenize("<|im_start|>", special=True)
        assert marker("<|im_start|>") == f"<[{start[0]}]>"
        assert marker("<tool_call>") == '"<tool_call>"'
        grammar = Format("lark", f'start: {marker("<|im_start|>")} "assistant"')
        ids = model.tokenize("Hello", add_bos=True)
        events = list(
            model.stream(
                ids, SamplingParams(temperature=1.0, seed=0, max_tokens=20), constraint=constraint_for(model, grammar)
            )
        )
        assert events[0].id == start[0]  # type: ignore[union-attr]
        done = events[-1]
        assert isinstance(done, Done) and done.stats.valid and done.text == "assistant"
    finally:
        model.close()
