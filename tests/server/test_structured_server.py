"""Structured output and tool calls through a real `llmrun serve` process and the official openai SDK:
``chat.completions.parse`` with a pydantic model, json_object, completions with a schema, tools with
auto / required / a named function, streamed tool-call deltas, a tool result sent back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support import serving

pytestmark = pytest.mark.slow


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population: int = Field(ge=0, le=40_000_000)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                "b": {"type": "integer", "minimum": -1000, "maximum": 1000},
            },
            "required": ["a", "b"],
        },
    },
}
TOOLS: list[Any] = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def url(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("serve"))
    with serving.running(["-m", str(smollm), "--parallel", "4", "--ctx", "2048"], env) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def check_call(call: Any) -> None:
    tool = {t["function"]["name"]: t for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    assert call.id and call.type == "function"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_parse_with_a_pydantic_model(client: openai.OpenAI, model: str, seed: int) -> None:
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Tell me about Paris."}],
        response_format=City,
        temperature=0.9,
        seed=seed,
        max_tokens=300,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    jsonschema.validate(json.loads(choice.message.content or ""), City.model_json_schema())


def test_json_object_answers_an_object(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a dog as JSON with a name and an age."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=300,
    )
    if completion.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)
    else:  # a string that runs on is cut, and said to be
        assert completion.choices[0].finish_reason == "length"


def test_completions_with_a_schema(client: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    completion = client.completions.create(
        model=model,
        prompt="Is the sky blue? Answer in JSON: ",
        max_tokens=50,
        temperature=0.7,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}},
    )
    jsonschema.validate(json.loads(completion.choices[0].text), schema)


def test_a_cut_answer_is_length_not_parsed(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(model=model, messages=ASK, response_format=City, max_tokens=3)


def test_a_keyword_that_cannot_be_enforced_is_a_400_naming_it(client: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model,
            messages=ASK,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "response_format" and "uniqueItems" in error["message"]
    assert client.models.list().data  # and the server keeps serving


@pytest.mark.parametrize("seed", [1, 2])
def test_required_tool_calls_match_their_parameters(client: openai.OpenAI, model: str, seed: int) -> None:
    completion = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0.8, seed=seed, max_tokens=400
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call)


def test_a_named_function_is_called(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is 2 plus 3?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
        temperature=0,
        max_tokens=200,
    )
    calls = completion.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["add"]
    check_call(calls[0])
    assert completion.choices[0].finish_reason == "tool_calls"


def test_auto_answers_text_or_valid_calls(client: openai.OpenAI, model: str) -> None:
    for seed in (1, 2, 3):
        completion = client.chat.completions.create(
            model=model, messages=ASK, tools=TOOLS, temperature=1.0, seed=seed, max_tokens=300
        )
        choice = completion.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            for call in choice.message.tool_calls:
                check_call(call)
        else:
            assert choice.finish_reason in ("stop", "length") and choice.message.content is not None


def test_tool_call_deltas_stream_and_a_result_goes_back(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=300, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    fragments: list[str] = []  # the arguments' pieces, in the chunks that carried them
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                if delta.id:  # the head comes first: id and name, arguments empty
                    assert not entry["id"] and delta.function and delta.function.name
                    assert delta.function.arguments == ""
                entry["id"] += delta.id or ""
                entry["name"] += (delta.function.name if delta.function else None) or ""
                piece = (delta.function.arguments if delta.function else None) or ""
                entry["arguments"] += piece
                fragments += [piece] if piece else []
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and calls
    first = calls[0]
    assert first["name"] == "get_weather" and first["id"]
    jsonschema.validate(json.loads(first["arguments"]), WEATHER["function"]["parameters"])
    assert len(fragments) > 2  # streamed as generated, not whole at the end (issue 41)
    whole = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=300
    )
    [call] = whole.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == json.loads(first["arguments"]) and call.function.name == first["name"]
    followed = client.chat.completions.create(
        model=model,
        messages=[
            *ASK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": first["id"],
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": first["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": first["id"], "content": '{"temperature_c": 18, "sky": "clear"}'},
        ],
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_tokens=60,
    )
    assert followed.choices[0].message.content
    assert followed.choices[0].message.tool_calls is None


def test_bad_tool_requests_are_400s(client: openai.OpenAI, model: str) -> None:
    for extra in (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
        {"tool_choice": "required"},
    ):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=model, messages=ASK, max_tokens=5, **extra)  # type: ignore[call-overload]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=[*ASK, {"role": "tool", "content": "x"}], max_tokens=5)  # type: ignore[list-item]
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "messages[1].tool_call_id"


def test_text_answers_stream_as_they_come_when_tools_are_offered(client: openai.OpenAI, model: str) -> None:
    """tool_choice none (and auto answering in text): the text streams token by token, not at the end."""
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello in a short sentence."}],
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=60,
        stream=True,
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 3  # token by token
    text = "".join(pieces)
    assert text.strip() and not text.startswith("{")  # the text, not the JSON it was generated in


def test_tools_beside_a_response_format(client: openai.OpenAI, model: str) -> None:
    """An agent offering tools and asking for its final answer in a schema gets calls or that JSON."""
    for seed in (1, 2, 3):
        completion = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Tell me about Paris, or look up its weather."}],
            tools=TOOLS,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "City", "schema": City.model_json_schema()},
            },
            temperature=0.9,
            seed=seed,
            max_tokens=300,
        )
        message = completion.choices[0].message
        if message.tool_calls:
            for call in message.tool_calls:
                check_call(call)
        else:
            City.model_validate_json(message.content or "")
