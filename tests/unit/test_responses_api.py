"""The Responses API's bodies, answers and events (pure): input items into the engine's conversation, namespaces
flattened and given back, the fields clients send and llmrun leaves aside, the 400s naming a field, and the
streamed events with the final Response repeating the streamed items under the same ids."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmrun.api.errors import ApiError
from llmrun.api.openai import Limits
from llmrun.api.responses import OutputIds, output_items, parse_count, parse_create, response_body, stored
from llmrun.api.responses_stream import EventStream
from llmrun.decoding.events import Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.result import Result
from llmrun.prompt.template import ToolCall
from llmrun.structured.dialects import HERMES

LIMITS = Limits(max_tokens=256)
FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def parse(earlier: tuple[dict[str, Any], ...] = (), **fields: Any) -> Any:
    return parse_create({"model": "m", "input": "Hi", **fields}, SamplingParams(), LIMITS, earlier)


def refused(**fields: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(**fields)
    return caught.value


def result(**fields: Any) -> Result:
    base = Result("Hello", 10, 3, "eos", None, None, 0.1, 1.0, 1.0, cached_tokens=4)  # type: ignore[arg-type]
    return Result(**{**{f: getattr(base, f) for f in base.__slots__}, **fields})  # type: ignore[attr-defined]


def test_items_become_the_engines_conversation() -> None:
    call = parse(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should call."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Lyon"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "Rain"}]},
            {"role": "assistant", "content": "Sunny in Paris, rain in Lyon."},
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Thanks"},
        ],
        tools=[FUNCTION],
    )
    messages = call.request.messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "tool", "assistant", "user"]
    assert messages[0].content == "Be brief.\n\nUse tools.\n\nAnswer in French."  # folded, in order
    assert messages[2].reasoning == "I should call." and [c.id for c in messages[2].tool_calls] == ["call_1", "call_2"]
    assert messages[4].content == "Rain" and messages[4].tool_call_id == "call_2"
    assert all(item["id"] for item in call.items)  # each input item has an id (input_items lists them)


def test_a_namespace_is_flattened_for_the_model_and_given_back_under_the_clients_names() -> None:
    space = {"type": "namespace", "name": "weather", "description": "", "tools": [FUNCTION]}
    call = parse(tools=[space, {"type": "web_search"}, {"type": "custom", "name": "apply_patch"}])
    assert call.request.tools is not None and [t.name for t in call.request.tools.tools] == ["weather__get_weather"]
    assert call.names == {"weather__get_weather": ("weather", "get_weather")}
    assert call.skipped_tools == ("web_search", "apply_patch")
    made = output_items(
        result(content="", tool_calls=(ToolCall("c", "weather__get_weather", "{}"),)), OutputIds(), call.names
    )
    assert [(i["type"], i["name"], i["namespace"]) for i in made] == [("function_call", "get_weather", "weather")]
    back = parse(tools=[space], input=[{"role": "user", "content": "Hi"}, {**made[0]}])  # the call in history
    assert back.request.messages[-1].tool_calls[0].name == "weather__get_weather"
    chosen = parse(tools=[space], tool_choice={"type": "function", "name": "get_weather", "namespace": "weather"})
    assert chosen.request.tools is not None and chosen.request.tools.function == "weather__get_weather"


def test_what_real_clients_send_and_llmrun_leaves_aside_is_accepted() -> None:
    call = parse(
        prompt_cache_key="k",
        client_metadata={"session_id": "s"},
        include=["reasoning.encrypted_content"],
        reasoning={"summary": "auto"},
        store=False,
        safety_identifier="u",
        truncation="disabled",
        conversation=None,
    )
    assert call.store is False and call.request.think is None


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"input": []}, "input"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"temperature": 2.5}, "temperature"),
        ({"max_output_tokens": 8}, "max_output_tokens"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
        ({"tools": [{"type": "function", "name": "x y"}]}, "tools[0].name"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [FUNCTION]}, "tool_choice.name"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"include": ["everything"]}, "include"),
        ({"background": True}, "background"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ],
)
def test_a_wrong_field_is_a_400_naming_it(fields: dict[str, Any], named: str) -> None:
    error = refused(**fields)
    assert error.status == 400 and error.param == named, error.message


def test_an_answer_over_the_ceiling_is_cut_and_incomplete() -> None:
    call = parse(max_output_tokens=32_000)
    assert call.request.params.max_tokens == LIMITS.max_tokens and call.echo["max_output_tokens"] == 32_000
    body = response_body("resp_1", "m", call, 0, result(finish_reason="length"), [])
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["input_tokens_details"]["cached_tokens"] == 4


def test_a_stored_response_continues_with_its_whole_conversation() -> None:
    first = parse(input="My name is Ada.")
    body = response_body("resp_1", "m", first, 0, result(), output_items(result(), OutputIds(), {}))
    kept = stored(body, first, ())
    second = parse(tuple(kept["conversation"]), input="What is my name?")
    assert [(m.role, m.content) for m in second.request.messages] == [
        ("user", "My name is Ada."),
        ("assistant", "Hello"),
        ("user", "What is my name?"),
    ]
    assert parse_count({"model": "m", "input": "Hi", "tools": [FUNCTION]}).tools is not None


def test_the_event_sequence_of_a_stream_and_the_final_response() -> None:
    call = parse(stream=True)
    stream = EventStream(call, "resp_1", "m", 0)
    events = stream.start()
    events += stream.token(Token(1, "", reasoning="thinking…"))
    events += stream.token(Token(2, "Hel"))
    events += stream.token(Token(3, "lo"))
    events += stream.result(result(reasoning="thinking…"))
    names = [name for name, _ in events]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    data = [d for _, d in events]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    final = data[-1]["response"]
    done = [d["item"] for d in data if d["type"] == "response.output_item.done"]
    assert final["output"] == done and [i["type"] for i in done] == ["reasoning", "message"]
    assert data[10]["output_index"] == 1 and data[12]["text"] == "Hello"
    json.dumps(data)  # every event serializes


def test_streamed_calls_are_items_whose_arguments_arrive_as_generated() -> None:
    call = parse(stream=True, tools=[FUNCTION], tool_choice="required")
    stream = EventStream(call, "resp_1", "m", 0, HERMES)
    events = stream.start()
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for i in range(0, len(text), 7):
        events += stream.token(Token(i, text[i : i + 7]))
    final = result(text=text, content="", tool_calls=(ToolCall("call_x", "get_weather", '{"city": "Paris"}'),))
    events += stream.result(final)
    kinds = [d["type"] for _, d in events]
    assert kinds.count("response.function_call_arguments.delta") > 1
    added = next(d["item"] for _, d in events if d["type"] == "response.output_item.added")
    response = events[-1][1]["response"]
    assert response["output"][0]["call_id"] == added["call_id"] and response["output"][0]["name"] == "get_weather"
    assert json.loads(response["output"][0]["arguments"]) == {"city": "Paris"}


def test_an_error_mid_stream_is_an_error_event_then_response_failed() -> None:
    stream = EventStream(parse(stream=True), "resp_1", "m", 0)
    events = stream.start() + stream.token(Token(1, "Hel"))
    events += stream.failed({"code": "context_length_exceeded", "message": "the context is full", "param": "input"})
    assert [name for name, _ in events[-2:]] == ["error", "response.failed"]
    error, failed = events[-2][1], events[-1][1]["response"]
    assert error["code"] == "context_length_exceeded" and error["sequence_number"] == len(events) - 2
    assert failed["status"] == "failed" and failed["error"] == {
        "code": "context_length_exceeded",
        "message": "the context is full",
    }
