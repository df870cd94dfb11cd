"""Ollama's API on `llmrun serve`, used through the real `ollama` Python library (a real server process
on 127.0.0.1; SmolLM2-135M-Instruct by its registry name, all-MiniLM for embeddings)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import pytest

from tests.support import serving
from tests.support.hubserver import FakeHub

pytestmark = pytest.mark.slow

CHAT = "smollm2:135m"
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def hub(gemma_cache: Path) -> Iterator[FakeHub]:
    server = FakeHub()
    server.start()
    server.add("test/gemma-GGUF", "gemma-3-270m-Q4_K_M.gguf", gemma_cache)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(
    smollm: Path, minilm: Path, hub: FakeHub, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("serve"))
    env.pop("HF_HUB_OFFLINE")
    env["HF_ENDPOINT"] = hub.url  # pulls come from the local Hub test server
    args = ["-m", CHAT, "-m", str(minilm), "--parallel", "2", "--ctx", "1024", "--allow-pull"]
    with serving.running(args, env) as (url, _):
        yield url, minilm.name  # served under its file name: a client never sees where files lie


@pytest.fixture(scope="module")
def client(server: tuple[str, str]) -> ollama.Client:
    return ollama.Client(host=server[0], timeout=120)


def test_version_list_show_ps(client: ollama.Client, server: tuple[str, str]) -> None:
    assert httpx.get(server[0] + "/api/version").json()["version"]
    names = [m.model for m in client.list().models]
    assert CHAT in names and server[1] in names
    shown = client.show(CHAT)
    assert "<|im_start|>" in (shown.template or "")
    assert shown.details is not None and shown.details.family == "llama"
    assert "temperature" in (shown.parameters or "")
    running = [m.model for m in client.ps().models]
    assert CHAT in running


def test_generate_with_options_and_timings(client: ollama.Client) -> None:
    response = client.generate(
        CHAT, "The capital of France is", options={"temperature": 0, "num_predict": 8, "seed": 1}
    )
    assert response.done and response.done_reason == "length"
    assert response.response and response.eval_count == 8
    assert (response.prompt_eval_count or 0) > 0
    assert (response.total_duration or 0) >= (response.eval_duration or 0) > 0
    assert response.created_at and response.model == CHAT


def test_generate_streams_ndjson(client: ollama.Client) -> None:
    chunks = list(client.generate(CHAT, "Count to five:", stream=True, options={"temperature": 0, "num_predict": 12}))
    assert len(chunks) > 3
    assert all(not c.done for c in chunks[:-1]) and chunks[-1].done
    assert chunks[-1].done_reason == "length" and chunks[-1].eval_count == 12
    assert "".join(c.response for c in chunks).strip()


def test_raw_skips_the_chat_template_and_system_goes_in_it(client: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 4}
    raw = client.generate(CHAT, "1, 2, 3,", raw=True, options=options)
    templated = client.generate(CHAT, "1, 2, 3,", options=options)
    with_system = client.generate(CHAT, "1, 2, 3,", system="Continue the list.", options=options)
    assert 0 < (raw.prompt_eval_count or 0) < (templated.prompt_eval_count or 0)
    assert with_system.prompt_eval_count != templated.prompt_eval_count  # (SmolLM's template has its own default)


def test_chat_stream_and_not_with_a_stop(client: ollama.Client) -> None:
    messages = [{"role": "system", "content": "Answer in one word."}, *ASK]
    whole = client.chat(CHAT, messages=messages, options={"temperature": 0, "num_predict": 30})
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.done_reason in ("stop", "length")
    parts = list(client.chat(CHAT, messages=messages, stream=True, options={"temperature": 0, "num_predict": 30}))
    assert parts[-1].done and "".join(p.message.content or "" for p in parts)
    text = whole.message.content or ""
    word = text.split()[2]  # a stop string the answer reaches
    stopped = client.chat(CHAT, messages=messages, options={"temperature": 0, "num_predict": 30, "stop": [word]})
    assert stopped.done_reason == "stop" and stopped.message.content == text[: text.index(word)]


def test_format_schema_and_json(client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
        "required": ["city", "country"],
    }
    for seed in (1, 2):
        response = client.chat(CHAT, messages=ASK, format=schema, options={"temperature": 0.8, "seed": seed})
        jsonschema.validate(json.loads(response.message.content or ""), schema)
    generated = client.generate(CHAT, "A JSON object with a name:", format="json", options={"num_predict": 200})
    if generated.done_reason == "stop":
        json.loads(generated.response)


def test_tool_calls(client: ollama.Client) -> None:
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
          city: The city's name
        """
        return "sunny"

    response = client.chat(CHAT, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[get_weather])
    calls = response.message.tool_calls or []
    for call in calls:
        assert call.function.name == "get_weather"
        assert isinstance(call.function.arguments, dict) and isinstance(call.function.arguments.get("city"), str)
    if not calls:
        assert response.message.content


def test_streamed_chat_with_tools_shows_text_as_it_comes_or_calls_at_the_end(client: ollama.Client) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    for seed in (1, 2, 3):
        parts = list(
            client.chat(
                CHAT, messages=[{"role": "user", "content": "Tell me a short joke."}], tools=tools, stream=True,
                options={"temperature": 1.0, "seed": seed, "num_predict": 200},
            )
        )  # fmt: skip
        final = parts[-1]
        assert final.done and all(not p.done for p in parts[:-1])
        streamed = "".join(p.message.content or "" for p in parts)
        if final.message.tool_calls:
            assert streamed == "" and final.message.tool_calls[0].function.name == "add"
        elif final.done_reason == "length":  # cut before it was whole: what there is, as it is
            assert streamed.strip()
        else:
            assert streamed.strip() and not streamed.startswith("{")  # the text, not its JSON wrapping
            assert len([p for p in parts[:-1] if p.message.content]) > 1  # token by token


def test_embed_and_embeddings(client: ollama.Client, server: tuple[str, str]) -> None:
    one = client.embed(server[1], "hello world")
    assert len(one.embeddings) == 1 and len(one.embeddings[0]) == 384
    two = client.embed(server[1], ["a cat", "a dog"])
    assert len(two.embeddings) == 2 and (two.prompt_eval_count or 0) > 0
    legacy = client.embeddings(model=server[1], prompt="hello world")
    assert list(legacy.embedding) == pytest.approx(one.embeddings[0], abs=1e-6)


def test_an_empty_prompt_loads_the_model(client: ollama.Client) -> None:
    response = client.generate(CHAT, "")
    assert response.done and response.done_reason == "load" and response.response == ""


def test_pull_streams_progress_then_the_model_runs(client: ollama.Client, hub: FakeHub) -> None:
    statuses = list(client.pull("test/gemma-GGUF", stream=True))
    assert statuses[0].status == "pulling manifest" and statuses[-1].status == "success"
    downloading = [s for s in statuses if s.status.startswith("pulling gemma")]
    assert downloading and downloading[-1].completed == downloading[-1].total == 253113024
    response = client.generate(
        "test/gemma-GGUF", "The capital of France is", options={"temperature": 0, "num_predict": 8}
    )
    assert response.response.strip() == "the capital of the country of France."  # as `llmrun pull` + `run` answer
    downloads = [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    assert client.pull("test/gemma-GGUF").status == "success"
    assert [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r] == downloads  # nothing again
    with pytest.raises(ollama.ResponseError):
        client.pull("test/absent-GGUF")


def test_langchain_chat_ollama(server: tuple[str, str]) -> None:
    from langchain_ollama import ChatOllama
    from pydantic import BaseModel, Field

    class Capital(BaseModel):
        city: str = Field(max_length=30)
        country: str = Field(max_length=30)

    llm = ChatOllama(model=CHAT, base_url=server[0], temperature=0, num_predict=40)
    assert llm.invoke("What is the capital of France?").content
    chunks = list(llm.stream("Say hello."))
    assert len(chunks) > 1 and "".join(str(c.content) for c in chunks)
    structured = ChatOllama(model=CHAT, base_url=server[0], temperature=0.7).with_structured_output(Capital)
    answer = structured.invoke("What is the capital of France?")
    assert isinstance(answer, Capital) and answer.city


@pytest.mark.parametrize(
    ("call", "status"),
    [
        (lambda c: c.chat("no-such-model:1b", messages=ASK), 404),
        (lambda c: c.generate(CHAT, "hi", images=[b"\x89PNG"]), 400),
        (lambda c: c.generate(CHAT, "hi", template="{{ .Prompt }}"), 400),
        (lambda c: c.generate(CHAT, "hi", options={"temperature": "hot"}), 400),
        (lambda c: c.chat(CHAT, messages=ASK, format={"not": {}}), 400),
    ],
)
def test_errors_are_ollama_errors(client: ollama.Client, call: Any, status: int) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        call(client)
    assert info.value.status_code == status and info.value.error
    assert client.list().models  # and the server keeps serving


def test_error_bodies_have_ollama_shape(server: tuple[str, str]) -> None:
    response = httpx.post(server[0] + "/api/generate", content=b"{not json")
    assert response.status_code == 400 and set(response.json()) == {"error"}
