"""`run`, `chat` and `batch` through `llmrun serve` instances as remote engines: the answer a local run
gives, a fleet of two with one killed mid-run, `--resume` after Ctrl-C, and a key that never shows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serving
from tests.support.helpers import interruptible, llmrun

pytestmark = pytest.mark.slow

KEY = "sk-fleet-7f3a9c2e41d8"
QUESTION = "Name three colours of the rainbow."


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote-llmrun")


@pytest.fixture(scope="module")
def fleet(smollm: Path, home: Path) -> Iterator[list[tuple[str, subprocess.Popen[str]]]]:
    """Two `llmrun serve` processes with one thread each (two cores: one each), behind a key."""
    env = {**serving.hermetic_env(home), "LLMRUN_API_KEY": KEY}
    args = ["-m", str(smollm), "--parallel", "2", "--ctx", "1024", "--threads", "1"]
    started = [serving.start(args, env) for _ in range(2)]
    try:
        yield started
    finally:
        for _, process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                process.wait(timeout=30)


def client_env(home: Path, key: str | None = KEY) -> dict[str, str]:
    env = serving.hermetic_env(home / "client")
    return {**env, "LLMRUN_API_KEY": key} if key else env


def started_batch(command: list[str], home: Path, out: Path, lines: int) -> subprocess.Popen[str]:
    """``llmrun batch`` in the background, once ``lines`` answers are in ``out``."""
    batch = subprocess.Popen(
        [sys.executable, "-m", "llmrun", *command],
        env={**os.environ, **client_env(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().count("\n") >= lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    return batch


def endpoint(url: str) -> list[str]:
    return ["--endpoint", url + "/v1"]


def test_a_remote_run_answers_as_the_same_model_run_here(
    fleet: list[tuple[str, subprocess.Popen[str]]], smollm: Path, home: Path
) -> None:
    url = fleet[0][0]
    env = client_env(home)
    remote = llmrun(["run", *endpoint(url), QUESTION, "-t", "0", "-n", "24", "--json"], env=env)
    assert remote.returncode == 0, remote.stderr
    local = llmrun(["run", "-m", str(smollm), QUESTION, "-t", "0", "-n", "24", "--json"], env=env)
    got, want = json.loads(remote.stdout), json.loads(local.stdout)
    assert got["text"] == want["text"]
    assert got["tokens"]["prompt"] == want["tokens"]["prompt"] and got["tokens"]["generated"] == 24
    served = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]["id"]
    assert got["backend"] == "remote" and got["model"] == served
    assert got["timings"]["time_to_first_token_s"] > 0 and got["timings"]["generation_tokens_per_s"] > 0


def test_log_probabilities_come_through_the_endpoint_as_they_come_here(
    fleet: list[tuple[str, subprocess.Popen[str]]], smollm: Path, home: Path
) -> None:
    url = fleet[0][0]
    env = client_env(home)
    args = [QUESTION, "-t", "0", "-n", "12", "--json", "--logprobs", "3"]
    remote = llmrun(["run", *endpoint(url), *args], env=env)
    assert remote.returncode == 0, remote.stderr
    local = llmrun(["run", "-m", str(smollm), *args], env=env)
    got, want = json.loads(remote.stdout)["logprobs"], json.loads(local.stdout)["logprobs"]
    assert [e["token"] for e in got] == [e["token"] for e in want] and len(got) == 12
    assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in want], abs=1e-4)
    for g, w in zip(got, want, strict=True):
        assert [c["token"] for c in g["top"]] == [c["token"] for c in w["top"]]
        assert g["id"] == -1  # an endpoint does not send token ids


def test_rag_answers_through_the_endpoint_with_the_passages_in_its_prompt(
    fleet: list[tuple[str, subprocess.Popen[str]]], minilm: Path, home: Path, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "backup.md").write_text("The backup keys are rotated every 90 days by the on-call engineer, Ada.\n")
    (docs / "coffee.md").write_text("The office coffee machine is descaled on Fridays.\n")
    env = client_env(home)
    indexed = llmrun(["index", "add", str(docs), "-c", "ops", "--embed-model", str(minilm)], env=env)
    assert indexed.returncode == 0, indexed.stderr
    url = fleet[0][0]
    question = "Who rotates the backup keys?"
    asked = [*endpoint(url), question, "--rag", "ops", "-k", "1", "-t", "0", "-n", "24", "--json", "--show-context"]
    remote = llmrun(["run", *asked], env=env)
    assert remote.returncode == 0, remote.stderr
    assert "rotated every 90 days" in remote.stderr  # the passage went into the prompt the endpoint read
    report = json.loads(remote.stdout)
    assert report["backend"] == "remote" and report["tokens"]["prompt"] > 40


def test_serve_proxies_a_models_toml_entry_to_its_engine(
    fleet: list[tuple[str, subprocess.Popen[str]]], home: Path, tmp_path: Path
) -> None:
    """`llmrun serve -m far`, where `far` is an endpoint in models.toml: clients of the proxy get what the
    engine behind it answers (the official openai SDK and the ollama library, as against any server)."""
    import ollama
    from openai import OpenAI

    url = fleet[0][0]
    env = serving.hermetic_env(tmp_path)
    config = Path(env["LLMRUN_CONFIG_DIR"])
    config.mkdir(parents=True)
    (config / "models.toml").write_text(f'[models.far]\nendpoint = "{url}/v1"\napi_key_env = "FAR_KEY"\n')
    with serving.running(["-m", "far", "--parallel", "2"], {**env, "FAR_KEY": KEY}) as (proxy, process):
        client = OpenAI(base_url=proxy + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["far"]
        ask: Any = [{"role": "user", "content": QUESTION}]
        through = client.chat.completions.create(model="far", messages=ask, temperature=0, max_tokens=24)
        engine = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        served = engine.models.list().data[0].id
        direct = engine.chat.completions.create(model=served, messages=ask, temperature=0, max_tokens=24)
        assert through.choices[0].message.content == direct.choices[0].message.content
        assert through.usage is not None and direct.usage is not None
        assert through.usage.prompt_tokens == direct.usage.prompt_tokens
        stream = client.chat.completions.create(model="far", messages=ask, temperature=0, max_tokens=24, stream=True)
        pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        assert len(pieces) > 3 and "".join(pieces) == direct.choices[0].message.content
        weather: Any = {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
        called = client.chat.completions.create(
            model="far",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[weather],
            tool_choice="required",
            temperature=0,
            max_tokens=60,
        )
        [call] = called.choices[0].message.tool_calls or []
        assert called.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"  # type: ignore[union-attr]
        answer = ollama.Client(host=proxy, timeout=120).chat(
            "far", messages=ask, options={"temperature": 0, "num_predict": 24}
        )
        assert answer.message.content == direct.choices[0].message.content
    assert process.stderr is not None and KEY not in process.stderr.read()  # the engine's key never shows


def test_a_remote_chat_keeps_the_conversation(fleet: list[tuple[str, subprocess.Popen[str]]], home: Path) -> None:
    url = fleet[1][0]
    turns = "My name is Zorblax.\nRepeat my name.\n"
    done = llmrun(["chat", *endpoint(url), "-t", "0", "-n", "30"], stdin=turns, env=client_env(home))
    assert done.returncode == 0, done.stderr
    answers = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(answers) >= 2 and "Zorblax" in done.stdout.split("\n", 1)[1]


def test_without_the_key_one_line_names_the_variable_and_no_log_shows_the_key(
    fleet: list[tuple[str, subprocess.Popen[str]]], home: Path
) -> None:
    url = fleet[0][0]
    refused = llmrun(["run", *endpoint(url), "Hi"], env=client_env(home, key=None))
    assert refused.returncode == 1
    assert "refused the request (HTTP 401" in refused.stderr and "set LLMRUN_API_KEY" in refused.stderr
    shown = llmrun(["run", *endpoint(url), "Hi", "-n", "4", "--stats", "--show-params"], env=client_env(home))
    assert shown.returncode == 0 and KEY not in shown.stdout + shown.stderr


def test_health_reports_slots_for_a_load_balancer(fleet: list[tuple[str, subprocess.Popen[str]]]) -> None:
    health = httpx.get(fleet[0][0] + "/health").json()
    assert health["slots"] == {"total": 2, "busy": 0, "idle": 2} and health["queue"] == 0
    metrics = httpx.get(fleet[0][0] + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert "llmrun_slots 2.0" in metrics and "llmrun_busy_slots 0.0" in metrics


def test_resume_after_ctrl_c_finishes_the_job_without_repeating_a_line(
    fleet: list[tuple[str, subprocess.Popen[str]]], home: Path, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.jsonl"
    lines = [
        {
            "custom_id": f"job-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"Count to {i}."}],
                "max_tokens": 24,
                "temperature": 0,
            },
        }
        for i in range(12)
    ]
    jobs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    command = ["batch", str(jobs), "-o", str(out), *endpoint(fleet[0][0]), *endpoint(fleet[1][0]), "-P", "1"]
    batch = started_batch(command, home, out, lines=3)
    batch.send_signal(signal.SIGINT)
    batch.communicate(timeout=60)
    assert batch.returncode != 0
    first = out.read_text().splitlines()
    assert 3 <= len(first) < 12
    resumed = llmrun([*command, "--resume"], env=client_env(home))
    assert resumed.returncode == 0, resumed.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in records] == [f"job-{i}" for i in range(12)]
    for record in records:  # the OpenAI Batch API's output shape
        assert record["error"] is None and record["response"]["status_code"] == 200
        body = record["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] > 0


def test_batch_over_two_endpoints_with_one_killed_answers_every_prompt_once_in_order(
    fleet: list[tuple[str, subprocess.Popen[str]]], home: Path, tmp_path: Path
) -> None:
    """Last in the module: it kills one of the fleet."""
    (keep, _), (doomed, victim) = fleet
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"Write a short story about a cat named Cat{i}.\n" for i in range(16)))
    out = tmp_path / "out.jsonl"
    command = ["batch", str(prompts), "-o", str(out), *endpoint(keep), *endpoint(doomed), "-t", "0", "-n", "48"]
    batch = started_batch(command, home, out, lines=2)
    victim.kill()  # mid-run: it has requests in flight
    victim.wait(timeout=30)
    _, err = batch.communicate(timeout=300)
    assert batch.returncode == 0, err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == list(range(1, 17))
    assert all(line["tokens"]["generated"] > 0 and line["text"] for line in lines)
    assert "16 of 16 prompts answered" in err
