"""Tool calls in each model's own format (llmrun.structured.dialects), against the real templates that
write them: llama.cpp's `models/templates` (kept in tests/data/chat_templates), rendered by transformers'
own renderer. Each template's rendered calls are read back, accepted by the dialect's grammar (a wrong
call refused), and streamed in pieces that join to the whole."""

from __future__ import annotations

import json
import random
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from llmrun.structured.callstream import ArgumentsText, CallStart, CallStream
from llmrun.structured.dialects import DIALECTS, GENERIC, Dialect, dialect_for
from llmrun.structured.dialects.pattern import typed_value
from llmrun.structured.grammar import Constraint, compile_format
from llmrun.structured.tools import Tool, ToolUse

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City"},
        "days": {"type": "integer", "description": "Days"},
        "opts": {"type": "object", "description": "Options"},
        "tags": {"type": "array", "description": "Tags"},
        "flag": {"type": "boolean", "description": "Flag"},
        "none": {"type": "null", "description": "Nothing"},
    },
    "required": ["city"],
}
ZONE = {"type": "object", "properties": {"zone": {"type": "string", "description": "Zone"}}}
TOOLS = (Tool("get_weather", "Weather", json.dumps(PARAMETERS)), Tool("get_time", "Time", json.dumps(ZONE)))
CASES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "one": [("get_weather", {"city": "Paris", "days": 3})],
    "two": [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "Europe/Paris"})],
    "nested": [("get_weather", {"city": "Zürich", "opts": {"units": "metric", "hours": [9, 17]}, "tags": ["a", "b"]})],
    "strings": [("get_weather", {"city": 'say "hi"\nand \\ back ünïcödé 日本'})],
    "scalars": [("get_weather", {"city": "Oslo", "days": -2, "flag": True, "none": None})],
}
IDS = ("abc123xyz", "def456uvw")  # Mistral's templates take nine letters and digits
# read back by the parser but not by these families' templates' own logic: MiniMax M3 writes an object's
# members as nested tags and drops nulls; Muse Glimmer writes each further call as a message of its own
KNOWN = {"MiniMax-M3.jinja", "muse-glimmer.jinja"}


def render(template: str, messages: list[dict[str, Any]], generation: bool) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    tools = [t.openai() for t in TOOLS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=template,
            add_generation_prompt=generation,
            bos_token="<s>",
            eos_token="</s>",
        )
    return str(out[0])


@cache
def answer(name: str, case: str, content: str = "", reasoning: str = "") -> str | None:
    """What the template writes for an assistant turn with ``case``'s calls (None: it refuses them)."""
    template = (TEMPLATES / name).read_text()
    calls = CASES[case]
    user = {"role": "user", "content": "Weather in Paris?"}
    turn = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": IDS[i], "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)
        ],
        **({"reasoning_content": reasoning} if reasoning else {}),
    }
    results = [{"role": "tool", "tool_call_id": IDS[i], "name": n, "content": "ok"} for i, (n, _) in enumerate(calls)]
    try:
        prompt = render(template, [user], True)
        whole = render(template, [user, turn, *results], False)
    except Exception:
        return None
    cut = 0
    while cut < min(len(prompt), len(whole)) and prompt[cut] == whole[cut]:
        cut += 1
    for opening, closing in (("<", ">"), ("[", "]")):  # not inside a marker the two share the start of
        start, end = whole.rfind(opening, 0, cut), whole.rfind(closing, 0, cut)
        cut = start if start > end else cut
    text = whole[cut:]
    return text if all(n in text for n, _ in calls) else None  # (one call a turn: the rest come later)


def names() -> list[str]:
    return sorted(p.name for p in TEMPLATES.glob("*.jinja"))


def dialect_of(name: str) -> Dialect:
    return dialect_for((TEMPLATES / name).read_text())


def read(dialect: Dialect, text: str) -> list[tuple[str, Any]]:
    _, calls = dialect.parse(text, TOOLS)
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_every_template_that_writes_calls_has_a_dialect_of_its_own() -> None:
    chosen = {name: dialect_of(name).name for name in names()}
    assert GENERIC.name not in chosen.values(), [n for n, d in chosen.items() if d == GENERIC.name]
    assert chosen["Qwen3-Coder.jinja"] == chosen["Qwen3.5-4B.jinja"] == "qwen3-coder"
    assert chosen["Qwen-Qwen3-0.6B.jinja"] == chosen["NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"] == "hermes"
    assert chosen["GLM-4.6.jinja"] == chosen["poolside-Laguna-S-2.1.jinja"] == "glm"
    assert chosen["moonshotai-Kimi-K2.jinja"] == "kimi-k2" and chosen["openai-gpt-oss-120b.jinja"] == "gpt-oss"
    assert chosen["meta-llama-Llama-3.1-8B-Instruct.jinja"] == "llama3"
    assert chosen["deepseek-ai-DeepSeek-V3.1.jinja"] == "deepseek-v3.1"
    assert chosen["google-gemma-4-31B-it.jinja"] == "gemma4" and chosen["LFM2.5-8B-A1B.jinja"] == "lfm2"
    assert {d.name for d in DIALECTS} <= set(chosen.values())  # each family has its real template here
    assert len({d.name for d in DIALECTS}) == len(DIALECTS)  # names are unique (`show` prints them)


def test_calls_each_template_renders_are_read_back() -> None:
    """One call, several, nested objects and lists, strings with quotes, new lines, backslashes and
    non-ASCII, integers, booleans and null, and text before the call: name and arguments equal."""
    failed: dict[str, list[str]] = {}
    for name in names():
        dialect = dialect_of(name)
        for case, calls in CASES.items():
            for content in ("", "Let me check."):
                text = answer(name, case, content)
                if text is None:
                    continue
                got = read(dialect, text)
                if got != calls:
                    failed.setdefault(name, []).append(f"{case}{'+text' if content else ''}: {got}")
    passed = len(names()) - len(failed)
    assert passed / len(names()) >= 0.95, failed
    assert set(failed) <= KNOWN, {k: v for k, v in failed.items() if k not in KNOWN}


def _calls_text(dialect: Dialect, text: str) -> str:
    found = dialect._read(text, {}, partial=False)
    assert found is not None
    start = found.start
    if dialect.syntax is not None and dialect.syntax.lead:  # (text the family writes before, not constrained)
        import re

        lead = re.compile(dialect.syntax.lead).match(text, start)
        start = lead.end() if lead else start
    return text[start : found.end]


def accepts(toy: Any, dialect: Dialect, text: str, use: ToolUse) -> bool:
    return accepts_format(toy, dialect.format(use, json.dumps), text)


# the template writes what no grammar of ours writes (the same JSON values, spelled otherwise): Command R+
# indents its JSON; Muse names the first function before its calls; Reka writes non-ASCII as \u escapes
GRAMMAR_KNOWN = {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", "muse-glimmer.jinja"}
GRAMMAR_KNOWN_STRINGS = {"Reka-Edge.jinja"}


@pytest.fixture(scope="module")
def toy() -> Any:
    import llguidance

    from tests.unit.test_structured import ToyVocabulary

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ToyVocabulary()))


@pytest.mark.parametrize("case", ["one", "two", "strings"])
def test_each_templates_own_calls_are_what_the_grammar_allows(toy: Any, case: str) -> None:
    refused: dict[str, str] = {}
    for name in names():
        text = answer(name, case)
        if text is None or name in GRAMMAR_KNOWN or (case == "strings" and name in GRAMMAR_KNOWN_STRINGS):
            continue
        dialect = dialect_of(name)
        calls = _calls_text(dialect, text)
        if not accepts(toy, dialect, calls, ToolUse(TOOLS, "required")):
            refused[name] = calls
        wrong = calls.replace("get_weather", "get_wether", 1)
        assert not accepts(toy, dialect, wrong, ToolUse(TOOLS, "required")), name
    assert not refused, refused


@pytest.mark.parametrize("name", names())
@pytest.mark.parametrize("mode", ["auto", "required"])
def test_every_dialects_grammar_compiles(name: str, mode: str) -> None:
    compile_format(dialect_of(name).format(ToolUse(TOOLS, mode), json.dumps))  # type: ignore[arg-type]


def streamed(dialect: Dialect, text: str, rng: random.Random) -> tuple[list[str], list[str]]:
    stream = CallStream(dialect, TOOLS)
    got_names: list[str] = []
    arguments: list[str] = []
    end = 0
    while end < len(text):
        end = min(len(text), end + rng.randint(1, 7))
        for event in stream.advance(text[:end]):
            if isinstance(event, CallStart):
                assert event.index == len(got_names)
                got_names.append(event.name)
                arguments.append("")
            else:
                assert isinstance(event, ArgumentsText) and event.text
                arguments[event.index] += event.text
    return got_names, arguments


@pytest.mark.parametrize("seed", range(3))
def test_calls_streamed_in_any_pieces_join_to_the_calls_read_whole(seed: int) -> None:
    rng = random.Random(seed)
    for name in names():
        dialect = dialect_of(name)
        for case in ("one", "two", "nested", "strings"):
            text = answer(name, case)
            if text is None or name in KNOWN:
                continue
            _, calls = dialect.parse(text, TOOLS)
            got_names, arguments = streamed(dialect, text, rng)
            assert got_names == [c.name for c in calls], (name, case)
            assert arguments == [c.arguments for c in calls], (name, case)


def test_a_name_streams_before_its_arguments_and_xml_arguments_as_each_completes() -> None:
    dialect = dialect_of("Qwen3-Coder.jinja")
    stream = CallStream(dialect, TOOLS)
    assert stream.advance("<tool_call>\n<function=get_wea") == []
    assert stream.advance("<tool_call>\n<function=get_weather>\n") == [CallStart(0, "get_weather")]
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    assert stream.advance(text) == []
    text += "is\n</parameter>\n"
    assert stream.advance(text) == [ArgumentsText(0, '{"city": "Paris"')]
    text += "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    assert stream.advance(text) == [ArgumentsText(0, ', "days": 3}')]


def test_xml_values_are_typed_by_the_schema() -> None:
    assert typed_value("3", {"type": "integer"}) == 3
    assert typed_value("3", {"type": "string"}) == "3"  # a string stays a string
    assert typed_value("true", {"type": "boolean"}) is True
    assert typed_value("True", {"type": "boolean"}) is True  # (Python's spelling, as some templates write)
    assert typed_value('{"a": [1]}', {"type": "object"}) == {"a": [1]}
    assert typed_value("{'a': [1]}", {"type": "object"}) == {"a": [1]}
    assert typed_value("  indented\n", {"type": "string"}) == "  indented\n"  # a value's blanks are its own
    assert typed_value("not json", {"type": "integer"}) == "not json"  # (the schema check says so later)
    dialect = dialect_of("Qwen3-Coder.jinja")
    code = "def f():\n    return 1\n"
    text = f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{code}\n</parameter>\n</function>\n</tool_call>"
    assert read(dialect, text) == [("get_weather", {"city": code})]


def test_an_answer_that_is_not_a_call_stays_text() -> None:
    for name in ("Qwen3-Coder.jinja", "GLM-4.6.jinja", "moonshotai-Kimi-K2.jinja", "LFM2.5-8B-A1B.jinja"):
        dialect = dialect_of(name)
        assert dialect.parse("It is sunny in Paris.", TOOLS) == ("It is sunny in Paris.", ())
        broken = dialect.syntax.start + " not a call" if dialect.syntax else ""
        content, calls = dialect.parse(broken, TOOLS)
        assert calls == () and content == broken


def test_a_call_read_back_renders_through_the_template_as_it_was_written() -> None:
    """The round trip: the calls read from a template's own text, put back in the conversation (results
    without a name, as OpenAI clients send them), render as the original conversation renders."""
    from llmrun.prompt.template import Context, Message, ToolCall, render_text
    from llmrun.structured.tools import named_results

    differ = []
    for name in names():
        text = answer(name, "two") or answer(name, "one")
        if text is None or name in KNOWN:
            continue
        case = "two" if answer(name, "two") else "one"
        template = (TEMPLATES / name).read_text()
        _, calls = dialect_of(name).parse(text, TOOLS)
        calls = tuple(ToolCall(IDS[i], c.name, c.arguments) for i, c in enumerate(calls))
        ours = [
            Message("user", "Weather in Paris?"),
            Message("assistant", "", tool_calls=calls),
            *(Message("tool", "ok", tool_call_id=IDS[i]) for i in range(len(calls))),
        ]
        context = Context("<s>", "</s>", add_generation_prompt=False, tools=tuple(t.openai() for t in TOOLS))
        rendered = render_text(template, named_results(ours), context)
        user = {"role": "user", "content": "Weather in Paris?"}
        turn = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": IDS[i], "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(CASES[case])
            ],
        }
        results = [
            {"role": "tool", "tool_call_id": IDS[i], "name": n, "content": "ok"} for i, (n, _) in enumerate(CASES[case])
        ]
        if rendered != render(template, [user, turn, *results], False):
            differ.append(name)
    assert not differ


@pytest.mark.parametrize("opened", [True, False], ids=["prompt-opened", "model-opens"])
def test_a_reasoning_model_reasons_before_its_constrained_call(toy: Any, opened: bool) -> None:
    from llmrun.structured.tools import reasoning_first

    dialect = dialect_of("Qwen3.5-4B.jinja")
    call = answer("Qwen3.5-4B.jinja", "one")
    assert call is not None
    calls = _calls_text(dialect, call)
    for mode in ("required", "auto"):
        fmt = reasoning_first(
            dialect.format(ToolUse(TOOLS, mode), json.dumps), "</think>", json.dumps, None if opened else "<think>"
        )
        compile_format(fmt)
        head = "" if opened else "<think>"
        assert accepts_format(toy, fmt, f"{head}The user wants Paris.</think>\n\n{calls}")
        assert not accepts_format(toy, fmt, f"{head}The user wants Paris.</think>\n\n<tool_call>\n<function=nope>")
        if not opened:
            assert accepts_format(toy, fmt, calls)  # (reasoning is the model's choice)
    auto = reasoning_first(dialect.format(ToolUse(TOOLS, "auto"), json.dumps), "</think>", json.dumps, None)
    assert accepts_format(toy, auto, "Hmm.</think>\n\nIt is sunny.")


def accepts_format(toy: Any, fmt: Any, text: str) -> bool:
    constraint = Constraint(toy, fmt)
    for byte in text.encode():
        constraint.accept(byte)
        if constraint.failed:
            return False
    return constraint.complete


def test_a_raw_string_keeps_to_its_schemas_length(toy: Any) -> None:
    dialect = dialect_of("Qwen3-Coder.jinja")
    schema = {"type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 5}}}
    use = ToolUse((Tool("f", "", json.dumps(schema)),), "required")
    call = "<tool_call>\n<function=f>\n<parameter=code>\n{}\n</parameter>\n</function>\n</tool_call>"
    assert accepts(toy, dialect, call.format("a\nb"), use)
    assert not accepts(toy, dialect, call.format("abcdef"), use)
    assert not accepts(toy, dialect, call.format("a"), use)


def test_calls_after_a_reasoning_models_reasoning_are_read_once_it_is_split_off() -> None:
    """A reasoning model writes its reasoning, then its calls: the answer's reasoning is split off as the
    engine splits it (its template's markers, opened by the prompt or by the model), and the rest read."""
    from llmrun.decoding.reasoning import split, thinking_for

    thought = "The user wants the forecast, so I call get_weather."
    read_after: list[str] = []
    unsplit: list[str] = []
    for name in names():
        template = (TEMPLATES / name).read_text()
        text = answer(name, "two", reasoning=thought) or answer(name, "one", reasoning=thought)
        if text is None or thought not in text or name in KNOWN:
            continue  # (a template that does not write past reasoning back)
        prompt = render(template, [{"role": "user", "content": "Weather in Paris?"}], True)
        thinking = thinking_for(template, prompt)
        case = "two" if answer(name, "two", reasoning=thought) else "one"
        if thinking is None:  # reasoning markers llmrun does not know: the calls are still read after them
            assert read(dialect_of(name), text) == CASES[case], name
            unsplit.append(name)
            continue
        if not thinking.started and not text.lstrip().startswith(thinking.markers.open):
            continue  # the generation prompt closes the reasoning (Command R7B): the model answers at once
        reasoning, rest = split(thinking, text)
        assert thought in (reasoning or ""), name
        assert read(dialect_of(name), rest) == CASES[case], name
        read_after.append(name)
    assert len(read_after) >= 10, read_after  # Qwen3, Qwen3.5, GLM, DeepSeek, MiniMax, Nemotron 3, …
    # reasoning these families write in their own channels is not told apart yet (it stays the answer's
    # text): Gemma 4's <|channel>thought, gpt-oss's analysis channel, Hunyuan's and Kimi K3's built tags
    assert set(unsplit) <= {
        "Kimi-K3.jinja", "google-gemma-4-31B-it-interleaved.jinja", "google-gemma-4-31B-it.jinja",
        "openai-gpt-oss-120b.jinja", "tencent-Hy3.jinja",
    }, unsplit  # fmt: skip


def test_gpt_oss_calls_as_its_models_write_them() -> None:
    """The template writes `` to=functions.x<|channel|>commentary json<|message|>``; gpt-oss models write
    the recipient after the channel, with a constraint type: both are read."""
    dialect = dialect_of("openai-gpt-oss-120b.jinja")
    written = (
        "<|channel|>analysis<|message|>Need the forecast.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 3}<|call|>'
    )
    assert read(dialect, written) == [("get_weather", {"city": "Paris", "days": 3})]
    stream = CallStream(dialect, TOOLS)
    events = [event for end in range(1, len(written) + 1) for event in stream.advance(written[:end])]
    assert events[0] == CallStart(0, "get_weather")
    assert "".join(e.text for e in events if isinstance(e, ArgumentsText)) == '{"city": "Paris", "days": 3}'
