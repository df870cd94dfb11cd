"""The server's KV store: a client that comes back after a restart, with the same long preamble, finds its
cells on disk (the slots' cells are kept there when the server stops), through OpenAI's client."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.support import serving

pytestmark = pytest.mark.slow
WORDS = [
    *("the", "river", "keeper", "lamp", "night", "town", "harbour", "boat"),
    *("stone", "bridge", "market", "winter", "bell", "road", "tower", "garden"),
]
PREAMBLE = "You answer questions about this text. " + " ".join(WORDS[(i * 5) % 16] for i in range(900))


def ask(client: OpenAI, question: str) -> Any:
    response = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "system", "content": PREAMBLE}, {"role": "user", "content": question}],
        max_tokens=4,
        temperature=0,
    )
    return response.usage


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_a_client_back_after_a_restart_finds_its_preamble(
    smollm: Path, tmp_path: Path, stop_signal: signal.Signals
) -> None:
    env = serving.hermetic_env(tmp_path)
    args = ["-m", f"{smollm}", "--ctx", "2048", "--parallel", "2"]
    url, process = serving.start(args, env)
    try:
        client = OpenAI(base_url=url + "/v1", api_key="unused")
        first = ask(client, "Which word comes first?")
        assert first.prompt_tokens_details.cached_tokens == 0
    finally:
        serving.stop(process, stop_signal)
    assert process.returncode == 0
    with serving.running(args, env) as (url, _):
        client = OpenAI(base_url=url + "/v1", api_key="unused")
        back = ask(client, "Is there a bridge?")  # another question after the same preamble
        preamble = back.prompt_tokens_details.cached_tokens
        assert preamble > 900 and back.prompt_tokens - preamble < 20


def test_no_kv_cache_keeps_nothing_across_a_restart(smollm: Path, tmp_path: Path) -> None:
    env = serving.hermetic_env(tmp_path)
    args = ["-m", f"{smollm}", "--ctx", "2048", "--parallel", "1", "--no-kv-cache"]
    with serving.running(args, env) as (url, _):
        ask(OpenAI(base_url=url + "/v1", api_key="unused"), "Which word comes first?")
    with serving.running(args, env) as (url, _):
        again = ask(OpenAI(base_url=url + "/v1", api_key="unused"), "Which word comes first?")
        assert again.prompt_tokens_details.cached_tokens == 0
    assert not list((tmp_path / "llmrun").glob("cache/kv/*/*.kv"))
