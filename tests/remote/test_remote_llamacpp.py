"""`run`, `chat`, `batch` and `show` through a server llmrun did not write: llama-cpp-python's own
OpenAI server (``python -m llama_cpp.server``), a real process on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import serving
from tests.support.helpers import interruptible, llmrun

pytestmark = pytest.mark.slow


def _flash_attention(model: Path) -> bool:
    """Flash attention as llmrun chooses it for ``model`` here, so both servers compute alike."""
    from llmrun.backends.attention import flash_attention
    from llmrun.formats.gguf_header import read_header
    from llmrun.formats.memory import geometry

    geom = geometry(read_header(model))
    return flash_attention(geom.head_dim_k if geom else None, "f16", offloaded=False)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote-llamacpp")


@pytest.fixture(scope="module")
def url(smollm: Path, home: Path) -> Iterator[str]:
    port = serving.free_port()
    log = (home / "server.log").open("w")  # a file, not a pipe: its model-loading log would fill a pipe and block it
    args = ["--model", str(smollm), "--port", str(port), "--n_ctx", "1024", "--n_threads", "2"]
    args += ["--chat_format", "chatml", "--flash_attn", str(_flash_attention(smollm)).lower()]  # as llmrun loads it
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=serving.hermetic_env(home),
        preexec_fn=interruptible,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        serving.wait_for(base + "/v1/models", process, lambda: (home / "server.log").read_text()[-2000:])
        yield base + "/v1"
    finally:
        serving.stop(process)
        log.close()


def test_a_raw_prompt_answers_as_llmrun_answers_it_here(url: str, smollm: Path, home: Path) -> None:
    """Greedy, through the completions API: the same text as the local run (every sampling setting was
    sent, so its server's own repeat penalty of 1.1 did not apply)."""
    env = serving.hermetic_env(home)
    prompt = "The three primary colours are"
    remote = llmrun(["run", "--endpoint", url, prompt, "--raw", "-t", "0", "-n", "24", "--json"], env=env)
    assert remote.returncode == 0, remote.stderr
    local = llmrun(["run", "-m", str(smollm), prompt, "--raw", "-t", "0", "-n", "24", "--json"], env=env)
    got, want = json.loads(remote.stdout), json.loads(local.stdout)
    assert got["text"] == want["text"] and got["prompt_format"] == "plain"
    assert got["model"] == str(smollm) and got["tokens"]["generated"] == 24  # chunks counted: no usage in its stream


def test_log_probabilities_come_back_from_a_server_we_did_not_write(url: str, smollm: Path, home: Path) -> None:
    env = serving.hermetic_env(home)
    args = ["The three primary colours are", "--raw", "-t", "0", "-n", "8", "--json", "--logprobs", "2"]
    remote = llmrun(["run", "--endpoint", url, *args], env=env)
    assert remote.returncode == 0, remote.stderr
    local = llmrun(["run", "-m", str(smollm), *args], env=env)
    got, want = json.loads(remote.stdout)["logprobs"], json.loads(local.stdout)["logprobs"]
    assert "".join(e["token"] for e in got) == "".join(e["token"] for e in want)
    assert [e["logprob"] for e in got] == pytest.approx([e["logprob"] for e in want], abs=1e-3)


def test_a_chat_answer_streams_with_stats(url: str, home: Path) -> None:
    done = llmrun(
        ["run", "--endpoint", url, "Say hello.", "-t", "0", "-n", "16", "--stats"], env=serving.hermetic_env(home)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "not reported by the endpoint" in done.stderr and "time to first token" in done.stderr


def test_chat_and_batch_go_through_it(url: str, home: Path, tmp_path: Path) -> None:
    env = serving.hermetic_env(home)
    chat = llmrun(["chat", "--endpoint", url, "-t", "0", "-n", "12"], stdin="Hello!\nAnd again?\n", env=env)
    assert chat.returncode == 0, chat.stderr
    assert len([line for line in chat.stdout.splitlines() if line.strip()]) >= 2
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Count to {i + 3}."}) + "\n" for i in range(4)))
    out = tmp_path / "out.jsonl"
    # one at a time: its server interrupts a running request when another arrives
    batch = llmrun(
        ["batch", str(prompts), "-o", str(out), "--endpoint", url, "-t", "0", "-n", "12", "-P", "1"], env=env
    )
    assert batch.returncode == 0, batch.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["q0", "q1", "q2", "q3"]
    assert all(line["text"] for line in lines), lines


def test_an_answer_it_drops_for_a_newer_request_is_an_error_not_an_empty_answer(
    url: str, home: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"Write a long poem about the number {i}.\n" for i in range(4)))
    out = tmp_path / "out.jsonl"
    args = ["batch", str(prompts), "-o", str(out), "--endpoint", url, "-t", "0", "-n", "40", "-P", "4"]
    llmrun(args, env=serving.hermetic_env(home))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(line["text"] and line["stop_reason"] == "length" for line in lines), lines


def test_show_asks_it_what_it_serves(url: str, smollm: Path, home: Path) -> None:
    env = serving.hermetic_env(home)
    config = Path(env["LLMRUN_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / "models.toml").write_text(f'[models.elsewhere]\nendpoint = "{url}"\n')
    shown = llmrun(["show", "elsewhere", "--json"], env=env)
    assert shown.returncode == 0, shown.stderr
    card = json.loads(shown.stdout)["endpoints"][0]
    assert card["model"] == str(smollm) and card["endpoint"] == url
    listed = llmrun(["list"], env=env)
    assert "elsewhere" in listed.stdout and "remote" in listed.stdout
    ran = llmrun(["run", "-m", "elsewhere", "Hi", "-n", "4"], env=env)
    assert ran.returncode == 0, ran.stderr
