"""Tool calls read while they are generated (llmrun.structured.callstream): names as soon as written,
arguments in fragments that join to the generated JSON, whatever the pieces the text arrives in."""

from __future__ import annotations

import json
import random

import pytest

from llmrun.structured.callstream import ArgumentsText, CallStart, CallStream
from llmrun.structured.dialects import GENERIC, HERMES, LLAMA3, MISTRAL, Dialect

NESTED = {"city": "Zürich", "when": {"day": "mon", "hours": [9, 17]}, "note": 'say "hi", {ok}', "name": "x"}
WRITTEN = json.dumps(NESTED, ensure_ascii=False)
CASES = [
    (HERMES, f'<tool_call>\n{{"name": "get_weather", "arguments": {WRITTEN}}}\n</tool_call>'),
    (
        HERMES,
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": -3.5e2, "b": null}}\n</tool_call>',
    ),
    (LLAMA3, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    (MISTRAL, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {}}]'),
    (GENERIC, '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "[Paris]"}}]}'),
]


def streamed(dialect: Dialect, text: str, pieces: list[int]) -> tuple[list[str], list[str]]:
    stream = CallStream(dialect)
    names: list[str] = []
    arguments: list[str] = []
    end = 0
    for size in pieces:
        end = min(len(text), end + size)
        for event in stream.advance(text[:end]):
            if isinstance(event, CallStart):
                assert event.index == len(names) and event.name
                names.append(event.name)
                arguments.append("")
            else:
                assert isinstance(event, ArgumentsText) and event.text
                arguments[event.index] += event.text
    return names, arguments


@pytest.mark.parametrize(("dialect", "text"), CASES)
@pytest.mark.parametrize("seed", range(6))
def test_the_calls_as_they_stream_are_the_calls_read_from_the_whole_answer(
    dialect: Dialect, text: str, seed: int
) -> None:
    rng = random.Random(seed)
    pieces = [1] * len(text) if seed == 0 else [rng.randint(1, 9) for _ in range(len(text))]
    names, arguments = streamed(dialect, text, pieces)
    _, calls = dialect.parse(text)
    assert names == [c.name for c in calls]
    assert [json.loads(a) for a in arguments] == [json.loads(c.arguments) for c in calls]


def test_a_name_comes_before_its_arguments_and_arguments_as_they_grow() -> None:
    text = CASES[0][1]
    stream = CallStream(HERMES)
    cut = text.index('"arguments"')
    assert stream.advance(text[:cut]) == [CallStart(0, "get_weather")]
    grown = stream.advance(text[: cut + len('"arguments": {"city": "Zü')])
    assert grown == [ArgumentsText(0, '{"city": "Zü')]
    rest = stream.advance(text)
    assert "".join(e.text for e in rest if isinstance(e, ArgumentsText)).endswith('"name": "x"}')


def test_text_that_is_not_calls_gives_nothing() -> None:
    assert CallStream(HERMES).advance("The weather is fine.") == []
    assert CallStream(GENERIC).advance('{"response": "{\\"name\\": \\"x\\", \\"arguments\\": 1}"}') == []
