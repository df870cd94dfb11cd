"""`llmrun serve` as a real process on 127.0.0.1, used through the official `openai` SDK and raw HTTP.

One server for the module (SmolLM2-135M-Instruct, ChatML, --parallel 4, an API key); the last
test stops it with SIGINT while a stream is in flight.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serving
from tests.support.helpers import llmrun

pytestmark = pytest.mark.slow

KEY = "test-key-0123456789"
QUESTION = "What is the capital of France?"


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]
    model: str  # as the server lists it: a model given by path is served under its file name
    env: dict[str, str]
    embedder: str
    path: Path  # the chat model's file, for the CLI

    def client(self, **kwargs: Any) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0, timeout=120, **kwargs)

    def post(self, path: str, body: Any = None, *, key: str | None = KEY, raw: bytes | None = None) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        content = raw if raw is not None else json.dumps(body).encode()
        return httpx.post(self.url + path, content=content, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def server(smollm: Path, minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("serve"))
    args = ["-m", str(smollm), "-m", str(minilm), "--parallel", "4", "--ctx", "1024", "--api-key", KEY]
    with serving.running(args, env) as (url, process):
        yield Server(url, process, smollm.name, env, minilm.name, smollm)


def chat(server: Server, **kwargs: Any) -> Any:
    kwargs.setdefault("messages", [{"role": "user", "content": QUESTION}])
    return server.client().chat.completions.create(model=server.model, **kwargs)


def test_chat_completion_has_openai_fields_and_equals_llmrun_run(server: Server) -> None:
    response = chat(server, temperature=0, max_tokens=24)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert response.model == server.model and response.created > 0
    [choice] = response.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and choice.message.content
    usage = response.usage
    assert usage.completion_tokens <= 24 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    result = llmrun(["run", "-m", str(server.path), "-t", "0", "-n", "24", "--json", QUESTION], env=server.env)
    assert result.returncode == 0, result.stderr
    expected = json.loads(result.stdout)
    assert choice.message.content == expected["text"]
    assert usage.prompt_tokens == expected["tokens"]["prompt"]


def test_streaming_sends_role_deltas_finish_and_usage(server: Server) -> None:
    stream = chat(server, temperature=0, max_tokens=24, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1 and chunks[-2].choices[0].finish_reason == finishes[0]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert text == chat(server, temperature=0, max_tokens=24).choices[0].message.content
    assert chunks[-1].usage.completion_tokens == chat(server, temperature=0, max_tokens=24).usage.completion_tokens


def test_completions_with_a_prompt_list_and_logprobs(server: Server) -> None:
    client = server.client()
    response = client.completions.create(
        model=server.model, prompt=["The capital of France is", "1, 2, 3,"], max_tokens=5, temperature=0, logprobs=2
    )
    assert response.object == "text_completion" and len(response.choices) == 2
    for choice in response.choices:
        lp = choice.logprobs
        assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
        assert "".join(lp.tokens) == choice.text
        assert all(len(top) <= 2 and lp_ <= 0 for top, lp_ in zip(lp.top_logprobs, lp.token_logprobs, strict=True))
    assert response.usage.completion_tokens <= 10


def test_seeded_sampling_repeats_and_n_gives_several_choices(server: Server) -> None:
    # a first call leaves the prompt's KV cells in two slots; from then on each call evaluates the same rows in the
    # same batch shapes (a call that evaluates the whole prompt rounds differently, and at temperature 1 a draw
    # near a boundary between two tokens can go the other way)
    chat(server, temperature=1.0, seed=42, n=2, max_tokens=16)
    first = chat(server, temperature=1.0, seed=42, n=2, max_tokens=16)
    again = chat(server, temperature=1.0, seed=42, n=2, max_tokens=16)
    single = chat(server, temperature=1.0, seed=42, max_tokens=16)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert first.choices[0].message.content == single.choices[0].message.content  # choice 0 uses the seed itself
    assert first.choices[0].message.content != first.choices[1].message.content  # choice 1 its own
    assert first.usage.completion_tokens > single.usage.completion_tokens  # usage counts both choices
    assert first.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once, as OpenAI counts it


def test_logprobs_stop_and_max_completion_tokens(server: Server) -> None:
    response = chat(server, temperature=0, max_completion_tokens=6, logprobs=True, top_logprobs=3)
    choice = response.choices[0]
    assert choice.finish_reason == "length" and response.usage.completion_tokens == 6
    content = choice.logprobs.content
    assert len(content) == 6 and all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.logprob <= t.top_logprobs[0].logprob + 1e-6 for t in content)
    full = chat(server, temperature=0, max_tokens=24).choices[0].message.content
    word = full.split()[2]
    stopped = chat(server, temperature=0, max_tokens=24, stop=[word])
    assert stopped.choices[0].finish_reason == "stop" and word not in stopped.choices[0].message.content


def test_developer_role_and_content_parts(server: Server) -> None:
    parts = [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]
    with_parts = chat(server, temperature=0, max_tokens=12, messages=[{"role": "user", "content": parts}])
    plain = chat(server, temperature=0, max_tokens=12)
    assert with_parts.choices[0].message.content == plain.choices[0].message.content
    developer = chat(
        server,
        temperature=0,
        max_tokens=12,
        messages=[{"role": "developer", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}],
    )
    system = chat(
        server,
        temperature=0,
        max_tokens=12,
        messages=[{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": QUESTION}],
    )
    assert developer.choices[0].message.content == system.choices[0].message.content
    # developer is OpenAI's new name for system: the same prompt (SmolLM's template puts a default system
    # prompt in when none is given, so the count differs from the plain question's)
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens != plain.usage.prompt_tokens


def test_models_and_health(server: Server) -> None:
    models = server.client().models.list()
    assert sorted(m.id for m in models.data) == sorted([server.model, server.embedder])
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_embeddings_as_floats_and_base64_equal_llmrun_s_own(server: Server, minilm: Path) -> None:
    import numpy as np

    from llmrun.backends.gguf_embed import load_embedder

    texts = ["The cat sat on the mat.", "Quantum computers use qubits."]
    client = server.client()
    default = client.embeddings.create(model=server.embedder, input=texts)  # the SDK asks for base64
    floats = client.embeddings.create(model=server.embedder, input=texts, encoding_format="float")
    assert [d.index for d in default.data] == [0, 1] and default.model == server.embedder
    a, b = np.array([d.embedding for d in default.data]), np.array([d.embedding for d in floats.data])
    assert a.shape == (2, 384) and np.allclose(a, b, atol=1e-6)
    assert np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-4)
    local = load_embedder(minilm, 512, 2)
    try:
        expected = local.embed(texts)
        ids = local._llama.tokenize(texts[0].encode(), add_bos=False, special=False)
    finally:
        local.close()
    assert float(np.min(np.sum(a * expected, axis=1))) > 0.9999
    assert default.usage.prompt_tokens == default.usage.total_tokens > 0
    tokens = client.embeddings.create(model=server.embedder, input=[ids], encoding_format="float")
    assert float(np.dot(tokens.data[0].embedding, a[0])) > 0.999
    single = client.embeddings.create(model=server.embedder, input=texts[1])
    assert len(single.data) == 1 and float(np.dot(single.data[0].embedding, a[1])) > 0.9999  # batched alone


def test_embedding_errors(server: Server) -> None:
    good = {"model": server.embedder, "input": "hello"}
    assert _error(server.post("/v1/embeddings", {**good, "model": server.model}), 400)["param"] == "model"
    assert _error(server.post("/v1/embeddings", {**good, "input": ""}), 400)["param"] == "input[0]"
    assert _error(server.post("/v1/embeddings", {**good, "input": "word " * 1000}), 400)["code"] == (
        "context_length_exceeded"
    )
    assert _error(server.post("/v1/embeddings", {**good, "dimensions": 64}), 400)["param"] == "dimensions"
    assert _error(server.post("/v1/embeddings", {**good, "encoding_format": "int8"}), 400)["param"] == (
        "encoding_format"
    )
    chat_body = {"model": server.embedder, "messages": [{"role": "user", "content": "hi"}]}
    assert _error(server.post("/v1/chat/completions", chat_body), 400)["param"] == "model"
    assert server.post("/v1/embeddings", good).status_code == 200


def test_a_conversations_next_turn_reuses_its_cached_prefix(server: Server) -> None:
    """The next turn's prompt starts with the last one's: the server evaluates only the new part and
    says so in usage.prompt_tokens_details.cached_tokens (the answers' fidelity: tests/integration/
    test_prefix_reuse.py)."""
    history = [{"role": "system", "content": "You are a geography tutor who answers in one sentence."}]
    history.append({"role": "user", "content": QUESTION})
    first = chat(server, messages=history, temperature=0, max_tokens=16)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And what is the capital of Italy?"},
    ]
    turn = chat(server, messages=history, temperature=0, max_tokens=16)
    cached = turn.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens < cached < turn.usage.prompt_tokens
    again = chat(server, messages=history, temperature=0, max_tokens=16)  # everything but the last token kept
    assert again.usage.prompt_tokens_details.cached_tokens == turn.usage.prompt_tokens - 1
    assert again.choices[0].message.content


def test_eight_concurrent_streams_all_finish(server: Server) -> None:
    texts: dict[int, str] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            stream = chat(server, temperature=0.7, seed=i, max_tokens=32, stream=True)
            texts[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and sorted(texts) == list(range(8)) and all(texts.values())


def test_a_client_that_disconnects_frees_its_slot(server: Server) -> None:
    streams = []
    for _ in range(4):  # every slot busy with a long answer
        stream = chat(server, temperature=0.8, max_tokens=900, stream=True)
        next(iter(stream))
        streams.append(stream)
    for stream in streams:
        stream.close()
    started = time.monotonic()
    response = chat(server, temperature=0, max_tokens=8)
    assert response.choices[0].message.content
    assert time.monotonic() - started < 20  # not behind 4 × 900 tokens
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert "llmrun_busy_slots 0.0" in metrics and 'llmrun_requests_total{endpoint="/v1/chat/completions"' in metrics


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in response.text
    return dict(error)


def test_bad_requests_get_the_right_status_and_shape(server: Server) -> None:
    good = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert _error(server.post("/v1/chat/completions", raw=b"{not json"), 400)["code"] == "invalid_json"
    hot = _error(server.post("/v1/chat/completions", {**good, "temperature": "hot"}), 400)
    assert hot["param"] == "temperature" and hot["message"].startswith("temperature must be")
    assert _error(server.post("/v1/chat/completions", {**good, "top_p": 7}), 400)["param"] == "top_p"
    assert _error(server.post("/v1/chat/completions", {**good, "model": "no-such-model"}), 404)["code"] == (
        "model_not_found"
    )
    for name in ("/etc/passwd", "../x.gguf", "https://example.com/m.gguf", "model.gguf"):
        assert _error(server.post("/v1/chat/completions", {**good, "model": name}), 404)["code"] == "model_not_found"
    unenforceable = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"not": {"type": "string"}}}}
    refused = _error(server.post("/v1/chat/completions", {**good, "response_format": unenforceable}), 400)
    assert refused["param"] == "response_format" and '"not"' in refused["message"]
    assert _error(server.post("/v1/chat/completions", {**good, "frobnicate": 1}), 400)["param"] == "frobnicate"
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    with_image = {**good, "messages": [{"role": "user", "content": [image]}]}
    refused_image = _error(server.post("/v1/chat/completions", with_image), 400)  # a malformed data URL
    assert refused_image["param"] == "messages[0].content[0].image_url" and refused_image["code"] == "invalid_image"
    too_long = {**good, "messages": [{"role": "user", "content": "word " * 2000}]}
    overflow = _error(server.post("/v1/chat/completions", too_long), 400)
    assert overflow["code"] == "context_length_exceeded" and overflow["param"] == "messages"
    # the engine names the parameter; the server words it as the option its operator controls
    assert "the server's --ctx" in overflow["message"] and "`" not in overflow["message"]
    huge = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (10 * 1024 * 1024) + b'"}]}'
    assert _error(server.post("/v1/chat/completions", raw=huge), 413)["code"] == "request_too_large"
    assert _error(server.post("/v1/chat/completions", good, key=None), 401)["code"] == "missing_api_key"
    assert _error(server.post("/v1/chat/completions", good, key="wrong-key-000000"), 401)["code"] == "invalid_api_key"
    assert _error(server.post("/v1/chat/completions", {**good, "max_tokens": 10**6}), 400)["param"] == "max_tokens"
    assert httpx.get(server.url + "/health").status_code == 200
    assert server.post("/v1/chat/completions", good).status_code == 200  # still serving


def test_sigint_ends_streams_in_flight_with_an_error_and_exits_0(server: Server) -> None:
    """The last test: it stops the module's server."""
    body = {"model": server.model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 900}
    lines: list[str] = []
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={**body, "stream": True, "temperature": 0.8},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    ) as response:
        iterator = response.iter_lines()
        lines.append(next(iterator))
        server.process.send_signal(signal.SIGINT)
        lines += list(iterator)
    data = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
    assert data and "error" in json.loads(data[-1])
    assert server.process.wait(timeout=30) == 0
