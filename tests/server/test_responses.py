"""OpenAI's Responses API on `llmrun serve`, with the official `openai` SDK's `responses` against a real server
on 127.0.0.1 (SmolLM2, greedy, every prompt evaluated whole so that two routes' answers compare like with like):
plain and streamed answers equal to the chat route's, the streamed events in OpenAI's order and the final
Response equal to the streamed items, a function-call round trip (and a namespace's function called under the
client's names), previous_response_id continuing a stored response (GET, input_items, DELETE), text.format
validated by jsonschema, input_tokens equal to what a generation reports, a body shaped as Codex CLI sends it,
errors as the SDK's exception types, and the store bounded on disk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.support import serving

pytestmark = pytest.mark.slow
KEY = "responses-key-0123456789"
QUESTION = "Name three colours."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
    },
}


@pytest.fixture(scope="module")
def served(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("responses"))
    args = ["-m", str(smollm), "--ctx", "2048", "--parallel", "2", "--no-prompt-cache", "--api-key", KEY]
    with serving.running(args, env) as (address, _):
        yield address, Path(env["LLMRUN_HOME"])


@pytest.fixture(scope="module")
def url(served: tuple[str, Path]) -> str:
    return served[0]


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_a_response_is_the_chat_routes_greedy_answer(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=24)
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=24
    )
    assert response.object == "response" and response.id.startswith("resp_") and response.model == model
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == chat.choices[0].message.content
    truncated = chat.choices[0].finish_reason == "length"
    assert response.status == ("incomplete" if truncated else "completed")
    assert (response.incomplete_details is not None) == truncated
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens
    assert response.max_output_tokens == 24 and response.temperature == 0


def test_instructions_and_developer_messages_are_the_system_prompt(client: openai.OpenAI, model: str) -> None:
    asked: dict[str, Any] = {"model": model, "temperature": 0, "max_output_tokens": 24}
    response = client.responses.create(
        instructions="Answer in French.", input=[{"role": "user", "content": QUESTION}], **asked
    )
    developer = client.responses.create(
        input=[{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": QUESTION}], **asked
    )
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "Answer in French."}, {"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=24,
    )
    assert response.output_text == developer.output_text == chat.choices[0].message.content
    assert response.instructions == "Answer in French."


def test_a_streamed_response_is_the_same_answer_in_openais_event_order(client: openai.OpenAI, model: str) -> None:
    asked: dict[str, Any] = {"model": model, "input": QUESTION, "temperature": 0, "max_output_tokens": 200}
    whole = client.responses.create(**asked)
    events = list(client.responses.create(stream=True, **asked))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas == whole.output_text == final.output_text
    item = next(e for e in events if e.type == "response.output_item.done").item
    assert final.output == [item]  # the Response's output is the items streamed, under the same ids
    assert final.usage is not None and whole.usage is not None
    assert final.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_function_call_round_trip(client: openai.OpenAI, model: str, stream: bool) -> None:
    asked: dict[str, Any] = {"model": model, "temperature": 0, "tools": [WEATHER], "max_output_tokens": 64}
    question = "What is the weather in Paris for the next 3 days?"
    if stream:
        events = list(client.responses.create(input=question, tool_choice="required", stream=True, **asked))
        assert any(e.type == "response.function_call_arguments.delta" for e in events)  # as they are generated
        first = events[-1].response  # type: ignore[union-attr]
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [e.arguments for e in done] == [o.arguments for o in first.output]
    else:
        first = client.responses.create(input=question, tool_choice="required", **asked)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" and c.call_id.startswith("call_") for c in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    answers = [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 21 °C"} for c in calls]
    second = client.responses.create(previous_response_id=first.id, input=answers, **asked)
    assert second.status in ("completed", "incomplete") and second.previous_response_id == first.id
    # the same turn sent whole (the call items back in the input) is the same answer
    again = client.responses.create(input=[{"role": "user", "content": question}, *calls, *answers], **asked)
    assert [o.model_dump(exclude={"id", "call_id"}) for o in again.output] == [
        o.model_dump(exclude={"id", "call_id"}) for o in second.output
    ]


def test_a_namespaces_function_is_called_under_the_names_the_client_knows(client: openai.OpenAI, model: str) -> None:
    space = {"type": "namespace", "name": "weather", "description": "Weather tools.", "tools": [WEATHER]}
    response = client.responses.create(
        model=model,
        input="What is the weather in Paris for the next 3 days?",
        tools=[space, {"type": "web_search"}],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" and c.namespace == "weather" for c in calls)
    raw = httpx.post(
        str(client.base_url) + "responses",
        json={"model": model, "input": "Hi", "tools": [{"type": "web_search"}], "max_output_tokens": 16},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    )
    assert raw.status_code == 200 and raw.headers["llmrun-skipped-tools"] == "web_search"  # said, not a failure


def test_previous_response_id_continues_a_stored_response(client: openai.OpenAI, model: str) -> None:
    asked: dict[str, Any] = {"model": model, "temperature": 0, "max_output_tokens": 24}
    first = client.responses.create(input="My name is Ada. Remember it.", **asked)
    second = client.responses.create(previous_response_id=first.id, input="What is my name?", **asked)
    whole = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": "My name is Ada. Remember it."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        temperature=0,
        max_tokens=24,
    )
    assert second.output_text == whole.choices[0].message.content
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = client.responses.input_items.list(second.id, order="asc")
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]  # type: ignore[union-attr]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(previous_response_id=first.id, input="And now?", **asked)
    assert refused.value.param == "previous_response_id"  # type: ignore[attr-defined]
    unstored = client.responses.create(input="Hi", store=False, **asked)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_text_format_json_schema_is_followed(client: openai.OpenAI, model: str) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=model,
        input="Describe a person as JSON.",
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
        temperature=0,
        max_output_tokens=200,
    )
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text is not None and response.text.format.type == "json_schema"


def test_input_tokens_are_the_prompt_tokens_a_generation_reports(client: openai.OpenAI, model: str) -> None:
    input_ = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    counted = client.responses.input_tokens.count(model=model, input=input_, tools=[WEATHER])  # type: ignore[arg-type]
    made = client.responses.create(model=model, input=input_, tools=[WEATHER], max_output_tokens=16)  # type: ignore[arg-type]
    assert made.usage is not None and counted.input_tokens == made.usage.input_tokens


def test_a_body_as_codex_cli_sends_it_is_answered(url: str, model: str) -> None:
    """The fields Codex CLI 0.169.0 sends (ids on input items, developer messages, a namespace, a hosted tool,
    reasoning.summary, include, prompt_cache_key, client_metadata, store: false), streamed."""
    body = {
        "model": model,
        "instructions": "",
        "input": [
            {"type": "message", "id": "msg_1", "role": "developer",
             "content": [{"type": "input_text", "text": "Be brief."}]},
            {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
        ],
        "tools": [
            {"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.", "tools": [
                {"type": "function", "name": "spawn_agent", "strict": False, "parameters": {"type": "object"}}]},
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0123",
        "client_metadata": {"x-codex-installation-id": "1"},
        "max_output_tokens": 32,
    }  # fmt: skip
    with httpx.stream(
        "POST", url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
    ) as answer:
        assert answer.status_code == 200
        events = [json.loads(line[5:]) for line in answer.iter_lines() if line.startswith("data:")]
    assert events[0]["type"] == "response.created" and events[-1]["type"] in (
        "response.completed",
        "response.incomplete",
    )
    assert events[-1]["response"]["store"] is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": "hi", "max_output_tokens": 4}, "max_output_tokens"),
        ({"input": "hi", "frequency": 1}, "frequency"),
        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
        ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input[0].call_id"),
        ({"input": [{"type": "computer_call", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": "hi", "tools": [{"type": "function", "name": "a b"}]}, "tools[0].name"),
        ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"input": "hi", "reasoning": {"effort": "maximal"}}, "reasoning.effort"),
        ({"input": "hi", "previous_response_id": "resp_0123456789abcdef01234567"}, "previous_response_id"),
        ({"input": "hi", "previous_response_id": "../../etc/passwd"}, "previous_response_id"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(
    client: openai.OpenAI, model: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body={"model": model, **body}, cast_to=httpx.Response)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == param and error["message"], error
    assert client.responses.create(model=model, input="Hi", max_output_tokens=16).status  # still serving


def test_a_wrong_model_and_a_wrong_key(client: openai.OpenAI, url: str) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="Hi")
    other = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        other.responses.create(model="x", input="Hi")
    for method, path in (("GET", "/v1/responses/resp_x"), ("DELETE", "/v1/responses/../../etc")):
        answer = httpx.request(method, url + path, headers={"Authorization": f"Bearer {KEY}"})
        assert answer.status_code == 404 and answer.json()["error"]["message"]


def test_stored_responses_are_files_on_disk_bounded_and_whole(
    served: tuple[str, Path], client: openai.OpenAI, model: str
) -> None:
    from llmrun.server.responses_store import ResponseStore

    home = served[1]
    made = client.responses.create(model=model, input="Hi", max_output_tokens=16)
    path = home / "responses" / f"{made.id}.json"
    record = json.loads(path.read_text())
    assert record["response"]["id"] == made.id and record["input_items"][0]["type"] == "message"
    assert not list(path.parent.glob(".partial-*"))  # written whole
    store = ResponseStore(path.parent / "bounded", max_count=3, max_bytes=10_000)
    for i in range(5):
        store.save(f"resp_{i:024x}", {"conversation": [], "n": i})
    kept = sorted(p.name for p in (path.parent / "bounded").glob("resp_*.json"))
    assert kept == [f"resp_{i:024x}.json" for i in (2, 3, 4)]  # the oldest went first
    store.save(f"resp_{9:024x}", {"conversation": ["x" * 6_000]})
    store.save(f"resp_{10:024x}", {"conversation": ["x" * 6_000]})
    assert store.load(f"resp_{9:024x}") is None and store.load(f"resp_{10:024x}") is not None  # bytes bound too
