"""A reasoning model through a real `llmrun serve` process and real clients: OpenAI's SDK sees
``reasoning_content`` (whole and streamed) and can turn reasoning off (``chat_template_kwargs``,
``reasoning_effort``); the ollama library sees ``thinking`` and ``think``.

SmolLM2 is not a reasoning model, so the server runs it under a template whose generation prompt
opens ``<think>`` unless ``enable_thinking`` is false (as Qwen3's and DeepSeek R1's do)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from tests.integration.test_templates import THINKING_TEMPLATE
from tests.support import serving

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def url(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("serve")
    template = home / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    args = ["-m", str(smollm), "--parallel", "2", "--ctx", "1024", "--template", str(template)]
    with serving.running(args, serving.hermetic_env(home)) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def name(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_reasoning_content_apart_from_the_answer(client: openai.OpenAI, name: str) -> None:
    message = client.chat.completions.create(model=name, messages=ASK, max_tokens=12, temperature=0).choices[0].message
    assert message.content == ""
    reasoning = message.model_extra.get("reasoning_content") if message.model_extra else None
    assert isinstance(reasoning, str) and reasoning.strip()


def test_streamed_reasoning_deltas_add_up_to_the_whole(client: openai.OpenAI, name: str) -> None:
    whole = client.chat.completions.create(model=name, messages=ASK, max_tokens=12, temperature=0).choices[0].message
    stream = client.chat.completions.create(model=name, messages=ASK, max_tokens=12, temperature=0, stream=True)
    reasoning, content = "", ""
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert (reasoning, content) == ((whole.model_extra or {})["reasoning_content"], whole.content)


@pytest.mark.parametrize("extra", [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}])
def test_reasoning_can_be_turned_off(client: openai.OpenAI, name: str, extra: dict[str, object]) -> None:
    message = (
        client.chat.completions.create(model=name, messages=ASK, max_tokens=12, temperature=0, extra_body=extra)
        .choices[0]
        .message
    )
    assert message.content and "reasoning_content" not in (message.model_extra or {})


def test_bad_template_variables_are_400s_and_the_server_goes_on(client: openai.OpenAI, name: str) -> None:
    for extra in ({"chat_template_kwargs": {"messages": []}}, {"chat_template_kwargs": "x"}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=name, messages=ASK, max_tokens=2, extra_body=extra)
        assert caught.value.body and "chat_template_kwargs" in str(caught.value.body)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=name, messages=ASK, max_tokens=2, reasoning_effort="extreme")  # type: ignore[arg-type]
    assert client.chat.completions.create(model=name, messages=ASK, max_tokens=2).choices


def test_ollama_think_and_thinking(url: str, name: str) -> None:
    o = ollama.Client(host=url)
    options = {"temperature": 0, "num_predict": 12}
    thought = o.chat(model=name, messages=ASK, think=True, options=options).message
    assert thought.thinking and thought.thinking.strip() and thought.content == ""
    plain = o.chat(model=name, messages=ASK, think=False, options=options).message
    assert plain.content and not plain.thinking
    streamed = list(o.generate(model=name, prompt="What is 2 + 2?", think=True, options=options, stream=True))
    assert "".join(part.thinking or "" for part in streamed).strip()
    with pytest.raises(ollama.ResponseError) as caught:
        o.chat(model=name, messages=ASK, think="sometimes", options=options)  # type: ignore[arg-type]
    assert caught.value.status_code == 400
