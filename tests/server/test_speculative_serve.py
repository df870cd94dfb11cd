"""Speculative decoding through a real `llmrun serve --draft ngram` process and the official openai
SDK: drafted tokens reported as OpenAI reports predicted outputs, streamed and not, with batching."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.support import serving

pytestmark = pytest.mark.slow

PARAGRAPH = (
    "The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper climbed "
    "the spiral stairs, trimmed the wick and watched the ships pass safely through the narrow strait."
)
REPEAT = [{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{PARAGRAPH}"}]


@pytest.fixture(scope="module")
def url(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("serve"))
    args = ["-m", str(smollm), "--parallel", "2", "--ctx", "1024", "--draft", "ngram", "--draft-tokens", "6"]
    with serving.running(args, env) as (base, _):
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_drafted_tokens_are_reported_as_predicted_outputs_are(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    answer = client.chat.completions.create(model=model, messages=REPEAT, temperature=0, max_tokens=80)  # type: ignore[arg-type]
    details = answer.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details is not None
    assert details.accepted_prediction_tokens and details.accepted_prediction_tokens >= 10
    assert details.rejected_prediction_tokens is not None and details.rejected_prediction_tokens >= 0
    assert "lighthouse" in (answer.choices[0].message.content or "")


def test_a_streamed_answer_carries_them_in_its_usage_chunk_and_equals_the_unstreamed(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    whole = client.chat.completions.create(model=model, messages=REPEAT, temperature=0, max_tokens=60)  # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model=model,
        messages=REPEAT,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=60,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.accepted_prediction_tokens


def test_requests_batched_together_each_draft_for_themselves(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    asks = [REPEAT, [{"role": "user", "content": "Name three colours."}]]

    def ask(messages: list[dict[str, str]]) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=40)  # type: ignore[arg-type]

    with ThreadPoolExecutor(2) as pool:
        quote, colours = list(pool.map(ask, asks))
    assert quote.choices[0].message.content and colours.choices[0].message.content
    assert quote.usage.completion_tokens_details.accepted_prediction_tokens  # type: ignore[union-attr]
