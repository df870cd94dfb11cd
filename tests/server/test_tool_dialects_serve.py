"""Calls in a model family's own format through a real `llmrun serve` and the real clients: Gemma 3
270M served under Qwen3-Coder's template (its XML parameters: ``<function=…><parameter=…>``), and the
OpenAI (Chat Completions and Responses), Anthropic and Ollama clients each get the call back as their API
shapes it — arguments typed by the tool's schema, streamed in fragments that join to the whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import ollama
import openai
import pytest

from tests.support import serving

pytestmark = pytest.mark.slow
TEMPLATE = Path(__file__).parents[1] / "data" / "chat_templates" / "Qwen3-Coder.jinja"
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "A forecast", "parameters": PARAMETERS}}
ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def base(gemma_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("serve")
    args = ["-m", str(gemma_cache), "--parallel", "1", "--ctx", "2048", "--template", str(TEMPLATE)]
    with serving.running(args, serving.hermetic_env(home)) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_chat_completions_whole_and_streamed(client: openai.OpenAI, model: str) -> None:
    asked: dict[str, Any] = {
        "model": model, "messages": ASK, "tools": [TOOL], "tool_choice": "required", "temperature": 0,
        "max_tokens": 96, "parallel_tool_calls": False,
    }  # fmt: skip
    whole = client.chat.completions.create(**asked).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls
    call = whole.message.tool_calls[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    jsonschema.validate(arguments, PARAMETERS)  # days an integer, as the schema types it
    fragments: list[str] = []
    names: list[str] = []
    for chunk in client.chat.completions.create(**asked, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            names += [delta.function.name] if delta.function and delta.function.name else []
            fragments += [delta.function.arguments] if delta.function and delta.function.arguments else []
    assert names == ["get_weather"] and len(fragments) > 1  # the arguments as each parameter completes
    assert json.loads("".join(fragments)) == arguments


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_api(client: openai.OpenAI, model: str, stream: bool) -> None:
    tool = {"type": "function", **TOOL["function"]}
    asked: dict[str, Any] = {
        "model": model, "input": ASK[0]["content"], "tools": [tool], "tool_choice": "required", "temperature": 0,
        "max_output_tokens": 96, "parallel_tool_calls": False, "store": False,
    }  # fmt: skip
    if stream:
        fragments: list[str] = []
        with client.responses.stream(**asked) as events:
            for event in events:
                if event.type == "response.function_call_arguments.delta":
                    fragments.append(event.delta)
            response = events.get_final_response()
    else:
        response = client.responses.create(**asked)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), PARAMETERS)
    if stream:
        assert len(fragments) > 1 and "".join(fragments) == calls[0].arguments


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_anthropic_messages(base: str, model: str, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    tool = {"name": "get_weather", "description": "A forecast", "input_schema": PARAMETERS}
    asked: dict[str, Any] = {
        "model": model, "max_tokens": 96, "messages": ASK, "tools": [tool], "tool_choice": {"type": "any"},
        "extra_body": {"temperature": 0},
    }  # fmt: skip
    fragments: dict[int, str] = {}  # each tool_use block's partial JSON, joined
    if stream:
        with client.messages.stream(**asked) as events:
            for event in events:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    fragments[event.index] = fragments.get(event.index, "") + event.delta.partial_json
            message = events.get_final_message()
    else:
        message = client.messages.create(**asked)
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses and all(u.name == "get_weather" for u in uses)
    for use in uses:
        jsonschema.validate(use.input, PARAMETERS)
    if stream:  # (parallel calls allowed: one block each)
        assert [json.loads(fragments[i]) for i in sorted(fragments)] == [u.input for u in uses]


def test_ollama_chat_and_a_round_trip(base: str, model: str) -> None:
    """Ollama's API has no tool_choice: the model chooses. A call it starts is constrained and read, so
    the answer is a typed call or text that holds no call's markup; the call and its result then go
    back through the family's template (Ollama's shapes: arguments an object, the result by tool name)."""
    client = ollama.Client(host=base)
    options = {"temperature": 0, "num_predict": 96}
    response = client.chat(model, messages=ASK, tools=[TOOL], options=options)
    calls = response.message.tool_calls or []
    for call in calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(dict(call.function.arguments), PARAMETERS)
    if not calls:
        assert response.message.content and "<tool_call>" not in response.message.content
    earlier = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}
    history = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [earlier]},
        {"role": "tool", "content": "Sunny, 21 degrees.", "tool_name": "get_weather"},
    ]
    answer = client.chat(model, messages=history, tools=[TOOL], options=options)
    assert answer.done and (answer.message.content or answer.message.tool_calls)
