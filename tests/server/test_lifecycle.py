"""What a server holds, and for how long: per-request keep_alive as Ollama documents it (through the real `ollama`
library, and llmrun's field on the OpenAI routes), Ollama's load and unload forms, `/api/ps` with each model's
memory, context, slots and expiry, and `llmrun ps` / `llmrun stop` against a real server (SmolLM2, by its
registry name, loaded at start and loaded again on demand after an unload)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.support import serving
from tests.support.helpers import llmrun

pytestmark = pytest.mark.slow
CHAT = "smollm2:135m"


@pytest.fixture(scope="module")
def url(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("lifecycle"))
    with serving.running(["-m", CHAT, "--parallel", "2", "--ctx", "1024"], env) as (address, _):
        yield address


@pytest.fixture(scope="module")
def client(url: str) -> ollama.Client:
    return ollama.Client(host=url, timeout=120)


def loaded(url: str) -> dict[str, Any]:
    return {m["name"]: m for m in httpx.get(url + "/api/ps", timeout=30).json()["models"]}


def gone(url: str, name: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if name not in loaded(url):
            return True
        time.sleep(0.2)
    return False


def test_ps_reports_memory_context_slots_and_expiry(client: ollama.Client, url: str) -> None:
    client.generate(CHAT)  # (loaded at start; an empty prompt loads it in any case)
    [running] = [m for m in client.ps().models if m.model == CHAT]
    assert running.size and running.size > 50 * 2**20  # weights + KV at its slots + overhead, the plan's
    raw = loaded(url)[CHAT]
    assert raw["context_length"] == 1024 and raw["llmrun"]["slots"] == 2 and raw["llmrun"]["busy"] == 0
    assert running.expires_at is not None and running.expires_at.year > datetime.now(UTC).year + 5  # forever


def test_keep_alive_zero_unloads_after_the_answer_and_a_request_loads_it_again(client: ollama.Client, url: str) -> None:
    answer = client.generate(CHAT, "Say hi.", options={"num_predict": 4, "temperature": 0}, keep_alive=0)
    assert answer.done and answer.response
    assert gone(url, CHAT, within=5)
    again = client.chat(CHAT, [{"role": "user", "content": "Hi"}], options={"num_predict": 4})  # loads on demand
    assert again.message.content and CHAT in loaded(url)


def test_the_load_and_unload_forms(client: ollama.Client, url: str) -> None:
    load = client.generate(CHAT, keep_alive="10m")
    assert load.done_reason == "load" and load.response == ""
    expires = loaded(url)[CHAT]["expires_at"]
    minutes = (datetime.fromisoformat(expires.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds() / 60
    assert 9 < minutes <= 10  # the request's keep_alive, not the server's
    unload = client.generate(CHAT, keep_alive=0)
    assert unload.done_reason == "unload" and CHAT not in loaded(url)  # at once, nothing generated
    chat_load = client.chat(CHAT, messages=[], keep_alive="1s")
    assert chat_load.done_reason == "load" and CHAT in loaded(url)
    assert gone(url, CHAT, within=6)  # "1s": unloaded after a second unused


def test_a_bad_keep_alive_and_an_unknown_model_are_ollamas_errors(client: ollama.Client, url: str) -> None:
    with pytest.raises(ollama.ResponseError) as bad:
        client.generate(CHAT, "Hi", keep_alive="soon")
    assert bad.value.status_code == 400 and "keep_alive" in str(bad.value.error)
    with pytest.raises(ollama.ResponseError) as unknown:
        client.generate("no-such-model:1b", keep_alive=0)
    assert unknown.value.status_code == 404


def test_keep_alive_on_the_openai_routes(url: str) -> None:
    chat = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    chat.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, extra_body={"keep_alive": "-1"}
    )
    assert "forever" in llmrun(["ps", "--url", url]).stdout
    chat.responses.create(model=CHAT, input="Hi", max_output_tokens=16, extra_body={"keep_alive": 0})
    assert gone(url, CHAT, within=5)
    with pytest.raises(openai.BadRequestError) as bad:
        chat.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Hi"}], extra_body={"keep_alive": "x"}
        )
    assert bad.value.body["param"] == "keep_alive"  # type: ignore[index]


def test_llmrun_ps_and_stop(client: ollama.Client, url: str) -> None:
    client.generate(CHAT, keep_alive="5m")
    shown = llmrun(["ps", "--url", url])
    assert shown.returncode == 0 and CHAT in shown.stdout and "CPU" in shown.stdout and "0 busy / 2" in shown.stdout
    assert "in 5 min" in shown.stdout
    as_json = json.loads(llmrun(["ps", "--url", url, "--json"]).stdout)
    assert [m["name"] for m in as_json["models"]] == [CHAT]
    stopped = llmrun(["stop", CHAT, "--url", url])
    assert stopped.returncode == 0 and CHAT not in loaded(url)
    again = llmrun(["stop", CHAT, "--url", url])
    assert again.returncode != 0 and "not loaded" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    nobody = llmrun(["ps", "--url", "http://127.0.0.1:9"])
    assert nobody.returncode != 0 and "no server answers" in nobody.stderr and "Traceback" not in nobody.stderr
    assert "no model is loaded" in llmrun(["ps", "--url", url]).stderr


# --- several models under a budget ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def three(
    smollm: Path, gemma_cache: Path, gemma_f16: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, list[str]]]:
    """SmolLM2, Gemma 3 270M Q4_K_M and Gemma 3 270M F16, under --max-models 2."""
    env = serving.hermetic_env(tmp_path_factory.mktemp("three"))
    models = [CHAT, str(gemma_cache), str(gemma_f16)]
    args = [part for model in models for part in ("-m", model)]
    with serving.running([*args, "--max-models", "2", "--parallel", "1", "--ctx", "512"], env) as (address, _):
        yield address, [CHAT, gemma_cache.name, gemma_f16.name]


LONG = "Write a long story about a lighthouse keeper, in many paragraphs."


def ask(url: str, model: str, tokens: int = 2, prompt: str = "Hi") -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "stream": False, "options": {"num_predict": tokens, "temperature": 0}}
    answer = httpx.post(url + "/api/generate", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_the_least_recently_used_idle_model_makes_room(three: tuple[str, list[str]]) -> None:
    url, (small, q4, f16) = three
    assert set(loaded(url)) == {q4, f16}  # the third -m model took the first one's place at start
    ask(url, q4)  # q4 used last: f16 is the least recently used
    ask(url, small)
    assert set(loaded(url)) == {q4, small}
    sizes = {name: model["size"] for name, model in loaded(url).items()}
    assert all(size > 0 for size in sizes.values())
    cards = {card["id"]: card["llmrun"] for card in httpx.get(url + "/v1/models", timeout=30).json()["data"]}
    assert (
        cards[small] == {"loaded": True, "size": sizes[small], "expires_in_s": None} and cards[f16]["loaded"] is False
    )


def test_a_model_answering_is_never_unloaded_to_make_room(three: tuple[str, list[str]]) -> None:
    """A long answer streams from the least recently asked model while another is asked for: the idle one goes,
    though it was asked more recently, and the busy one stays and finishes its answer whole."""
    import threading

    url, (small, q4, f16) = three
    ask(url, small)
    ask(url, q4)
    done: dict[str, Any] = {}
    busy = threading.Thread(target=lambda: done.update(ask(url, small, tokens=400, prompt=LONG)))
    busy.start()
    deadline = time.monotonic() + 30
    while loaded(url).get(small, {}).get("llmrun", {}).get("busy", 0) == 0:
        assert time.monotonic() < deadline, "the long answer never started"
        time.sleep(0.05)
    ask(url, q4)  # q4 asked after small: by time alone, small would go
    assert loaded(url)[small]["llmrun"]["busy"] == 1, "the long answer ended too soon to show anything"
    ask(url, f16)
    assert set(loaded(url)) == {small, f16}
    busy.join(timeout=300)
    assert done.get("done") is True and done["eval_count"] > 50  # the busy one's answer, whole


def test_load_and_unload_over_http(three: tuple[str, list[str]]) -> None:
    url, (small, *_) = three
    ask(url, small)
    unloaded = httpx.post(url + "/llmrun/models/unload", json={"model": small}, timeout=60)
    assert unloaded.status_code == 200 and unloaded.json()["unloaded"] is True and small not in loaded(url)
    again = httpx.post(url + "/llmrun/models/unload", json={"model": small}, timeout=60)
    assert again.status_code == 404 and again.json()["error"]["param"] == "model"
    made = httpx.post(url + "/llmrun/models/load", json={"model": small, "keep_alive": "2m"}, timeout=300)
    assert made.status_code == 200 and made.json()["loaded"] is True and small in loaded(url)
    assert httpx.post(url + "/llmrun/models/load", json={"model": "nope"}, timeout=60).status_code == 404


def test_a_budget_too_small_for_one_model_is_one_line_at_start(smollm: Path, tmp_path: Path) -> None:
    env = serving.hermetic_env(tmp_path)
    done = llmrun(["serve", "-m", CHAT, "--max-memory", "10M", "--port", "0"], env=env, timeout=120)
    assert done.returncode != 0 and "needs about" in done.stderr and "--max-memory" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_load_waits_for_the_busy_model_then_takes_its_place(smollm: Path, gemma_cache: Path, tmp_path: Path) -> None:
    """--max-models 1 and the one model answering: a request for another model waits (the answer completes
    whole), then the idle model is unloaded and the other loads and answers."""
    import threading

    env = serving.hermetic_env(tmp_path)
    store = Path(env["LLMRUN_HOME"]) / "models" / "embedded"  # the packaged Gemma, already in this home's store
    store.mkdir(parents=True)
    for source in (gemma_cache, gemma_cache.with_name(gemma_cache.name + ".verified.json")):
        (store / source.name).symlink_to(source)
    args = ["-m", CHAT, "--max-models", "1", "--parallel", "1", "--ctx", "512"]
    with serving.running(args, env) as (url, _):
        done: dict[str, Any] = {}
        busy = threading.Thread(target=lambda: done.update(ask(url, CHAT, tokens=120)))
        busy.start()
        deadline = time.monotonic() + 30
        while loaded(url).get(CHAT, {}).get("llmrun", {}).get("busy", 0) == 0:
            assert time.monotonic() < deadline, "the long answer never started"
            time.sleep(0.05)
        other = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "gemma3:270m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            timeout=300,
        )
        busy.join(timeout=300)
        assert done.get("done") is True and done["eval_count"] > 2  # the busy model's answer, whole
        assert other.status_code == 200, other.text  # it waited, then loaded
        assert set(loaded(url)) == {"gemma3:270m"}
