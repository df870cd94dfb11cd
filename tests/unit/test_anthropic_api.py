"""Anthropic's Messages bodies in, engine requests out, and answers back (pure): field by field against
Anthropic's API reference, with the fields real clients send that llmrun leaves aside."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from llmrun.api.anthropic import error_body, message_body, parse_count, parse_messages
from llmrun.api.anthropic_stream import EventStream
from llmrun.api.errors import ApiError
from llmrun.api.openai import Limits
from llmrun.decoding.events import Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.result import Result
from llmrun.prompt.template import ToolCall

LIMITS = Limits(max_tokens=512)
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def parse(**fields: Any) -> Any:
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return parse_messages(body, SamplingParams(), LIMITS)


def refused(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(**fields)
    return caught.value


def result(**fields: Any) -> Result:
    base = Result("Hello", 10, 3, "eos", None, None, 0.1, 1.0, 1.0, cached_tokens=4)  # type: ignore[arg-type]
    return dataclasses.replace(base, **fields)


def test_a_conversation_with_calls_and_results_becomes_the_engines_messages() -> None:
    call = parse(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "system", "content": "Reminder: be kind."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should call it.", "signature": "x"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                    {"type": "text", "text": "Thanks!"},
                ],
            },
        ],
        tools=[TOOL, {"type": "web_search_20250305", "name": "web_search"}],
        tool_choice={"type": "any"},
    )
    messages = call.request.messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[0].content == "Be brief.\n\nReminder: be kind."  # a system message among them folded in
    assert messages[2].content == "Let me look." and messages[2].reasoning == "I should call it."
    assert messages[2].tool_calls == (ToolCall("toolu_1", "get_weather", '{"city": "Paris"}'),)
    assert messages[3].tool_call_id == "toolu_1" and messages[3].content == "Sunny"
    assert call.request.tools is not None and call.request.tools.mode == "required"
    assert [t.name for t in call.request.tools.tools] == ["get_weather"] and call.skipped_tools == ("web_search",)


def test_what_real_clients_send_and_llmrun_leaves_aside_is_accepted() -> None:
    call = parse(
        max_tokens=32000,  # an agent's whole budget: cut at the server's ceiling, not refused
        thinking={"type": "adaptive"},
        metadata={"user_id": "u"},
        context_management={"edits": []},
        output_config={"effort": "high"},
        stream=True,
    )
    assert call.request.params.max_tokens == LIMITS.max_tokens and call.stream and call.request.think is None
    assert parse(thinking={"type": "enabled", "budget_tokens": 1024}).request.think is True
    assert parse(thinking={"type": "disabled"}).request.think is False


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"stop_sequences": ["x"] * 17}, "stop_sequences"),
        ({"mystery": True}, "mystery"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}]}, "tool_use_id"),
        ({"tools": [{"name": "a b", "input_schema": {}}]}, "tools[0].name"),
        ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice"),
        ({"thinking": {"type": "sometimes"}}, "thinking"),
    ],
)
def test_a_wrong_field_is_a_400_naming_it(fields: dict[str, Any], named: str) -> None:
    error = refused(**fields)
    assert error.status == 400 and named in error.message


def test_count_tokens_takes_the_conversation_without_max_tokens() -> None:
    request = parse_count({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "system": "S"})
    assert [m.role for m in request.messages] == ["system", "user"]


def test_an_answer_in_anthropics_shape() -> None:
    body = message_body(result(), "msg_1", "m", ())
    assert body["content"] == [{"type": "text", "text": "Hello"}] and body["stop_reason"] == "end_turn"
    assert body["usage"] == {
        "input_tokens": 6,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
        "output_tokens": 3,
    }
    called = result(content="", tool_calls=(ToolCall("call_9", "get_weather", '{"city": "Rome"}'),), reasoning="hm")
    blocks = message_body(called, "msg_2", "m", ())["content"]
    assert blocks[0] == {"type": "thinking", "thinking": "hm", "signature": ""}
    assert blocks[1] == {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Rome"}}
    stopped = message_body(result(finish_reason="stop", stop_string="END"), "msg_3", "m", ("END",))
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    assert message_body(result(finish_reason="length"), "m4", "m", ())["stop_reason"] == "max_tokens"
    assert error_body(404, "gone") == {"type": "error", "error": {"type": "not_found_error", "message": "gone"}}


def test_the_event_sequence_of_a_stream() -> None:
    call = parse(stream=True)
    stream = EventStream(call, "msg_1", "m", input_tokens=10)
    events = stream.start()
    events += stream.token(Token(1, "", reasoning="thinking…"))
    events += stream.token(Token(2, "Hel"))
    events += stream.token(Token(3, "lo"))
    events += stream.result(result(reasoning="thinking…"))
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [d for _, d in events]
    assert data[0]["message"]["usage"]["input_tokens"] == 10
    assert data[2]["content_block"]["type"] == "thinking" and data[3]["delta"]["type"] == "thinking_delta"
    assert data[5]["index"] == 1 and "".join(d["delta"]["text"] for d in data[6:8]) == "Hello"
    assert data[9]["delta"]["stop_reason"] == "end_turn" and data[9]["usage"]["output_tokens"] == 3
    json.dumps(data)  # every event serializes
