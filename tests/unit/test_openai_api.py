"""OpenAI bodies → engine requests, and the error for each kind of bad field (pure)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmrun.api import openai as api
from llmrun.api.errors import ApiError
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.result import Result

LIMITS = api.Limits(max_tokens=1024, max_n=4)
DEFAULTS = SamplingParams(temperature=0.8, top_k=40)


def chat(**fields: Any) -> api.Call:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return api.parse_chat(body, DEFAULTS, LIMITS)


def error(call: Any, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(**fields)
    return info.value


def test_a_chat_body_becomes_requests_with_openai_defaults_over_the_models() -> None:
    call = chat()
    [request] = call.requests
    assert request.params.max_tokens == -1 and request.params.top_k == 40 and request.params.temperature == 0.8
    assert request.messages[0].role == "user" and not call.stream and call.logprobs is None
    call = chat(temperature=0, top_p=0.5, top_k=5, min_p=0.1, repeat_penalty=1.1, seed=3, stop="x", n=3)
    assert len(call.requests) == 3 and [r.params.seed for r in call.requests] == [3, 4, 5]
    params = call.requests[0].params
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.stop) == (0, 0.5, 5, 0.1, ("x",))
    assert chat(max_completion_tokens=7).requests[0].params.max_tokens == 7
    assert chat(logprobs=True, top_logprobs=2).logprobs == 2 and chat(logprobs=True).requests[0].logprobs == 1


def test_roles_and_content_parts() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    [request, *_] = chat(messages=messages).requests
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "be brief"),
        ("user", "ab"),
        ("assistant", ""),
        ("tool", "42"),
    ]


@pytest.mark.parametrize(
    ("fields", "param", "status"),
    [
        ({"temperature": "hot"}, "temperature", 400),
        ({"temperature": 3}, "temperature", 400),
        ({"top_p": 0}, "top_p", 400),
        ({"seed": 1.5}, "seed", 400),
        ({"n": 9}, "n", 400),
        ({"max_tokens": 0}, "max_tokens", 400),
        ({"max_tokens": 5000}, "max_tokens", 400),
        ({"max_tokens": 5, "max_completion_tokens": 5}, "max_tokens", 400),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop", 400),  # the limits every API shares (api/limits.py)
        ({"stop": ["x" * 1001]}, "stop", 400),
        ({"stream_options": {"include_usage": True}}, "stream_options", 400),
        ({"top_logprobs": 2}, "top_logprobs", 400),
        ({"response_format": {"type": "xml"}}, "response_format.type", 400),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", 400),
        ({"tools": []}, "tools", 400),
        ({"logit_bias": {}}, "logit_bias", 400),
        ({"store": True}, "store", 400),
        ({"mystery": 1}, "mystery", 400),
        ({"messages": []}, "messages", 400),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", 400),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].image_url", 400),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content[0]", 400),
        ({"model": 7}, "model", 400),
        ({"continue_final_message": "yes"}, "continue_final_message", 400),
        ({"continue_final_message": True}, "continue_final_message", 400),  # the last message is the user's
    ],
)
def test_each_bad_field_is_a_400_naming_it(fields: dict[str, Any], param: str, status: int) -> None:
    exc = error(chat, **fields)
    assert (exc.status, exc.param) == (status, param)
    assert exc.body()["error"]["type"] == "invalid_request_error"


def test_continue_final_message_continues_the_assistants_last_message() -> None:
    messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    [request] = chat(messages=messages, continue_final_message=True).requests
    assert request.continue_final and request.messages[-1].content == "1, 2,"
    assert not chat(messages=messages).requests[0].continue_final


def test_a_body_that_is_not_an_object() -> None:
    with pytest.raises(ApiError) as info:
        api.parse_chat([1, 2], DEFAULTS, LIMITS)
    assert info.value.code == "invalid_json"


def test_completions_take_a_prompt_or_a_list_and_default_to_16_tokens() -> None:
    call = api.parse_completion({"model": "m", "prompt": ["a", "b"], "n": 2}, DEFAULTS, LIMITS)
    assert [r.prompt for r in call.requests] == ["a", "a", "b", "b"] and all(r.raw for r in call.requests)
    assert call.requests[0].params.max_tokens == 16
    assert api.parse_completion({"model": "m", "prompt": "a", "logprobs": 2}, DEFAULTS, LIMITS).logprobs == 2
    with pytest.raises(ApiError) as info:
        api.parse_completion({"model": "m", "prompt": [1]}, DEFAULTS, LIMITS)
    assert info.value.param == "prompt"
    with pytest.raises(ApiError) as info:
        api.parse_completion({"model": "m", "prompt": "a", "echo": True}, DEFAULTS, LIMITS)
    assert info.value.param == "echo"


def test_finish_reasons_and_usage() -> None:
    def result(reason: str, prompt: int, generated: int) -> Result:
        return Result("t", prompt, generated, reason, None, None, 0.1, 1.0, 1.0)  # type: ignore[arg-type]

    results = [result("eos", 5, 3), result("context", 5, 7)]
    assert api.usage(results) == {
        "prompt_tokens": 10,
        "completion_tokens": 10,
        "total_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    }
    drafted = dataclasses.replace(results[1], drafted=6, accepted=4)
    assert api.usage([results[0], drafted])["completion_tokens_details"] == {
        "accepted_prediction_tokens": 4,
        "rejected_prediction_tokens": 2,
    }
    cached = dataclasses.replace(results[0], cached_tokens=4)
    assert api.usage([cached])["prompt_tokens_details"] == {"cached_tokens": 4}
    # n choices of one prompt: the prompt counts once, every choice's tokens count
    two = api.usage([cached, results[0]], n=2)
    assert two["prompt_tokens"] == 5 and two["completion_tokens"] == 6
    assert two["prompt_tokens_details"]["cached_tokens"] == 4
    two_prompts = api.usage([result("eos", 5, 1), result("eos", 5, 1), result("eos", 9, 1), result("eos", 9, 1)], n=2)
    assert two_prompts["prompt_tokens"] == 14 and two_prompts["total_tokens"] == 18
    assert [api.chat_choice(i, r, None)["finish_reason"] for i, r in enumerate(results)] == ["stop", "length"]
    assert api.completion_choice(0, results[0], None) == {
        "index": 0,
        "text": "t",
        "logprobs": None,
        "finish_reason": "stop",
    }


def test_the_servers_ceiling_bounds_max_tokens_and_is_the_default() -> None:
    """serve --max-tokens: a request may ask for up to the ceiling (above it, a 400 naming the field, as
    OpenAI answers), and gets the server's default when it asks for none."""
    limits = api.Limits(max_tokens=100, max_n=4, default_tokens=100)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert api.parse_chat(body, SamplingParams(), limits).requests[0].params.max_tokens == 100
    assert api.parse_chat({**body, "max_tokens": 7}, SamplingParams(), limits).requests[0].params.max_tokens == 7
    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(ApiError) as raised:
            api.parse_chat({**body, field: 101}, SamplingParams(), limits)
        assert raised.value.status == 400 and raised.value.param == field
