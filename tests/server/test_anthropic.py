"""Anthropic's Messages API on `llmrun serve`, with the official `anthropic` SDK against a real server on
127.0.0.1 (SmolLM2, greedy — the SDK no longer has a temperature parameter, so it goes as an extra body
field, which the route still honours —, every prompt evaluated whole so that two routes' answers compare
like with like): plain and streamed answers equal to the OpenAI route's, a tool round trip whose input validates
against its schema, count_tokens equal to what a generation reports, errors as the SDK's exception types,
and a body shaped as Claude Code sends it (ignored fields and all) answered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.support import serving

pytestmark = pytest.mark.slow
KEY = "anthropic-key-0123456789"
QUESTION = "Name three colours."
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
    },
}


@pytest.fixture(scope="module")
def url(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("anthropic"))
    args = ["-m", str(smollm), "--ctx", "2048", "--parallel", "2", "--no-prompt-cache", "--api-key", KEY]
    with serving.running(args, env) as (address, _):
        yield address


@pytest.fixture(scope="module")
def model(url: str) -> str:
    return str(httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]["id"])


@pytest.fixture(scope="module")
def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)  # the key as x-api-key


def openai_answer(url: str, model: str, max_tokens: int) -> Any:
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=max_tokens
    )


def test_a_message_is_the_openai_routes_greedy_answer(client: anthropic.Anthropic, url: str, model: str) -> None:
    message = client.messages.create(
        model=model, max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": QUESTION}]
    )
    expected = openai_answer(url, model, 24)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == expected.choices[0].message.content  # type: ignore[union-attr]
    assert message.stop_reason == ("max_tokens" if expected.choices[0].finish_reason == "length" else "end_turn")
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == expected.usage.prompt_tokens
    assert message.usage.output_tokens == expected.usage.completion_tokens
    assert message.model == model


def test_a_streamed_message_is_the_same_answer(client: anthropic.Anthropic, model: str) -> None:
    asked: dict[str, Any] = {"model": model, "max_tokens": 24, "extra_body": GREEDY}
    whole = client.messages.create(messages=[{"role": "user", "content": QUESTION}], **asked)
    kinds = []
    with client.messages.stream(messages=[{"role": "user", "content": QUESTION}], **asked) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_a_stop_sequence_ends_the_answer_and_is_named(client: anthropic.Anthropic, model: str) -> None:
    whole = client.messages.create(
        model=model, max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": QUESTION}]
    )
    text = whole.content[0].text  # type: ignore[union-attr]
    word = text.split()[2]
    cut = client.messages.create(
        model=model,
        max_tokens=24,
        extra_body=GREEDY,
        stop_sequences=[word],
        messages=[{"role": "user", "content": QUESTION}],
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    assert text.startswith(cut.content[0].text) and word not in cut.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_round_trip(client: anthropic.Anthropic, model: str, stream: bool) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
    asked: dict[str, Any] = {"model": model, "max_tokens": 64, "extra_body": GREEDY, "tools": [WEATHER]}
    if stream:
        with client.messages.stream(messages=messages, tool_choice={"type": "any"}, **asked) as events:
            deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
            first = events.get_final_message()
        assert deltas  # the arguments arrive as they are generated
    else:
        first = client.messages.create(messages=messages, tool_choice={"type": "any"}, **asked)
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert uses and all(u.name == "get_weather" and u.id.startswith("toolu_") for u in uses)
    for use in uses:
        jsonschema.validate(use.input, WEATHER["input_schema"])
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": "Sunny, 21 degrees, all three days."}
                for u in uses
            ],
        },
    ]
    answer = client.messages.create(messages=messages, **asked)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.content


def test_count_tokens_is_what_a_generation_reads(client: anthropic.Anthropic, model: str) -> None:
    conversation: dict[str, Any] = {
        "system": "Be brief.",
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [WEATHER],
    }
    counted = client.messages.count_tokens(model=model, **conversation)
    message = client.messages.create(model=model, max_tokens=1, extra_body=GREEDY, **conversation)
    read = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == read > 0


def test_errors_are_the_sdks_exception_types(url: str, client: anthropic.Anthropic, model: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["type"] == "error" and missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="wrong-key-000000", max_retries=0).messages.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    bad: list[tuple[dict[str, Any], str]] = [
        ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0]"),
        (
            {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
            "tool_use_id",
        ),
        ({"max_tokens": 8, "temperature": 3, "messages": [{"role": "user", "content": "hi"}]}, "temperature"),
        ({"max_tokens": 8, "mystery": 1, "messages": [{"role": "user", "content": "hi"}]}, "mystery"),
    ]
    for body, field in bad:
        response = httpx.post(url + "/v1/messages", json={"model": model, **body}, headers={"x-api-key": KEY})
        assert response.status_code == 400, (body, response.text)
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert field in error["error"]["message"], (field, error)
    assert httpx.get(url + "/health").status_code == 200


def test_a_body_as_claude_code_sends_it_is_answered(url: str, model: str) -> None:
    """System blocks with cache_control, a system message among the messages, adaptive thinking, server
    tools, context_management, output_config, metadata, the beta query and header, 32,000 tokens asked for."""
    body = {
        "model": model,
        "max_tokens": 32000,
        "stream": False,
        "temperature": 0,
        "system": [
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Say hi.", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "The user is at a terminal."},
        ],
        "tools": [
            {**WEATHER, "cache_control": {"type": "ephemeral"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        ],
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "output_config": {"effort": "medium"},
        "metadata": {"user_id": "someone"},
    }
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
    response = httpx.post(url + "/v1/messages?beta=true", json=body, headers=headers, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["stop_reason"] in ("end_turn", "max_tokens", "tool_use") and answer["content"]
    assert answer["usage"]["output_tokens"] <= 2048  # cut at the server's --max-tokens, not refused
    assert response.headers["llmrun-skipped-tools"] == "web_search"  # the server tool left out, and said so
    streamed = httpx.post(url + "/v1/messages", json={**body, "stream": True}, headers=headers, timeout=300)
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"


def test_output_config_format_is_a_schema_the_answer_follows(client: anthropic.Anthropic, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {"colours": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3}},
        "required": ["colours"],
        "additionalProperties": False,
    }
    message = client.messages.create(
        model=model,
        max_tokens=64,
        extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        messages=[{"role": "user", "content": QUESTION}],
    )
    jsonschema.validate(json.loads(message.content[0].text), schema)  # type: ignore[union-attr]
