"""Ollama request bodies → engine requests (pure): options, format, tools, refused fields."""

from __future__ import annotations

import pytest

from llmrun.api.ollama import OllamaError, parse_chat, parse_generate
from llmrun.decoding.sampling import SamplingParams
from llmrun.structured import ANY_JSON

DEFAULTS = SamplingParams(temperature=0.7, max_tokens=512)


def test_options_map_onto_sampling_fields() -> None:
    options = {
        "temperature": 0,
        "top_k": 5,
        "top_p": 0.5,
        "min_p": 0.1,
        "num_predict": 12,
        "seed": 3,
        "stop": ["\n"],
        "repeat_penalty": 1.1,
        "repeat_last_n": 32,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.3,
        "num_ctx": 8192,  # the server's: accepted, not per request
    }
    call = parse_generate({"model": "m", "prompt": "hi", "options": options}, DEFAULTS)
    p = call.request.params
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.max_tokens, p.seed) == (0, 5, 0.5, 0.1, 12, 3)
    assert p.stop == ("\n",) and (p.repeat_penalty, p.repeat_last_n) == (1.1, 32)
    assert (p.presence_penalty, p.frequency_penalty) == (0.2, 0.3)
    assert call.stream is True  # Ollama streams unless told not to


def test_defaults_and_unlimited_predictions() -> None:
    call = parse_generate({"model": "m", "prompt": "hi", "stream": False}, DEFAULTS)
    assert call.request.params.max_tokens == -1 and call.request.params.temperature == 0.7 and not call.stream
    for value in (-1, -2):
        options = {"num_predict": value}
        assert (
            parse_generate({"model": "m", "prompt": "x", "options": options}, DEFAULTS).request.params.max_tokens == -1
        )


def test_format_system_raw_and_chat() -> None:
    call = parse_generate({"model": "m", "prompt": "x", "format": "json", "system": "be brief", "raw": True}, DEFAULTS)
    assert call.request.response_format == ANY_JSON and call.request.system == "be brief" and call.request.raw
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "2+3?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2}}}],
                },
                {"role": "tool", "content": "5", "tool_name": "add"},
            ],
            "tools": [{"type": "function", "function": {"name": "add", "parameters": schema}}],
            "format": schema,
        },
        DEFAULTS,
    )
    request = chat.request
    assert request.response_format is not None and request.response_format.schema() == schema
    assert request.tools is not None and request.tools.tools[0].name == "add"
    assert request.messages[1].tool_calls[0].arguments == '{"a": 2}'
    assert request.messages[2].name == "add"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": "x"}, "model is required"),
        ({"model": "m", "prompt": "x", "images": ["aGk="]}, "images"),
        ({"model": "m", "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
        ({"model": "m", "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": "m", "prompt": "x", "context": [1, 2]}, "context"),
        ({"model": "m", "prompt": "x", "think": "maybe"}, "think"),
        ({"model": "m", "prompt": "x", "options": {"mirostat": 1}}, "mirostat"),
        ({"model": "m", "prompt": "x", "options": {"temperature": "hot"}}, "temperature"),
        ({"model": "m", "prompt": "x", "options": {"top_p": 7}}, "top_p"),
        ({"model": "m", "prompt": "x", "format": "yaml"}, "format"),
        ({"model": "m", "prompt": "x", "frobnicate": 1}, "frobnicate"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
    ],
)
def test_refused_with_a_message_naming_the_field(body: dict[str, object], message: str) -> None:
    with pytest.raises(OllamaError, match=message) as info:
        parse_generate(body, DEFAULTS)
    assert info.value.status == 400 and info.value.body() == {"error": info.value.message}


def test_think_is_enable_thinking_or_a_level() -> None:
    assert parse_generate({"model": "m", "prompt": "x", "think": False}, DEFAULTS).request.variables == {
        "enable_thinking": False
    }
    leveled = parse_generate({"model": "m", "prompt": "x", "think": "high"}, DEFAULTS).request
    assert leveled.variables == {"reasoning_effort": "high", "enable_thinking": True}
    assert parse_generate({"model": "m", "prompt": "x"}, DEFAULTS).request.variables == {}


def test_chat_refusals() -> None:
    for body in (
        {"model": "m", "messages": []},
        {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
        {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
        {"model": "m", "messages": [{"role": "user", "content": 5}]},
    ):
        with pytest.raises(OllamaError):
            parse_chat(body, DEFAULTS)


def test_the_servers_ceiling_bounds_num_predict_and_replaces_no_limit() -> None:
    """serve --max-tokens: an answer without num_predict (or with -1) gets the ceiling; above it is a 400."""
    bounded = {"model": "m", "prompt": "hi"}
    assert parse_generate(bounded, DEFAULTS, 100).request.params.max_tokens == 100
    unlimited = {**bounded, "options": {"num_predict": -1}}
    assert parse_generate(unlimited, DEFAULTS, 100).request.params.max_tokens == 100
    assert parse_generate({**bounded, "options": {"num_predict": 40}}, DEFAULTS, 100).request.params.max_tokens == 40
    with pytest.raises(OllamaError) as raised:
        parse_chat(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 101}},
            DEFAULTS,
            100,
        )
    assert raised.value.status == 400 and "num_predict" in raised.value.message and "100" in raised.value.message
