"""One model across two llama.cpp RPC workers (``ggml-rpc-server``, llama.cpp's own, built from the
vendored sources) on 127.0.0.1: ``run``, ``chat``, ``serve`` and ``bench`` with ``--rpc``, the answer
against raw llama-cpp-python, and a worker killed mid-answer."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _machine_cache
from tests.support import rpc_workers as workers
from tests.support import serving
from tests.support.helpers import interruptible, llmrun

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
TOKENS = 32


@pytest.fixture(scope="module")
def bin_dir() -> Path | None:
    return workers.build(_machine_cache())


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rpc")


@pytest.fixture(scope="module")
def env(bin_dir: Path | None, home: Path) -> dict[str, str]:
    return {**serving.hermetic_env(home), **workers.client_env(bin_dir)}


@pytest.fixture(scope="module")
def pair(bin_dir: Path | None, home: Path) -> Iterator[str]:
    """Two workers, as --rpc names them."""
    with workers.running(bin_dir, home, 2) as started:
        yield ",".join(endpoint for endpoint, _ in started)


@pytest.fixture(scope="module")
def reference(gemma_cache: Path, env: dict[str, str]) -> str:
    script = Path(serving.__file__).with_name("rpc_reference.py")  # a script, run by its path
    done = subprocess.run(
        [sys.executable, str(script), str(gemma_cache), PROMPT, str(TOKENS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_run_splits_the_layers_over_both_workers_and_answers_as_llama_cpp_does_here(
    pair: str, gemma_cache: Path, env: dict[str, str], reference: str
) -> None:
    args = ["--debug", "run", "-m", str(gemma_cache), PROMPT, "--raw", "-t", "0", "-n", str(TOKENS), "--ctx", "512"]
    done = llmrun([*args, "--rpc", pair, "--json"], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["text"] == reference
    # llama.cpp's log: the KV cache of the layers each worker holds (the device name, the endpoint)
    for endpoint in pair.split(","):
        assert re.search(rf"RPC\d\[{re.escape(endpoint)}\] KV buffer size = +[0-9.]*[1-9]", done.stderr), done.stderr


def test_chat_batch_and_bench_use_the_workers(
    pair: str, gemma_cache: Path, env: dict[str, str], tmp_path: Path, reference: str
) -> None:
    chat = llmrun(
        ["chat", "-m", str(gemma_cache), "--rpc", pair, "-t", "0", "-n", "8"], stdin="Hello!\nAnd again?\n", env=env
    )
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert len([line for line in chat.stdout.splitlines() if line.strip()]) >= 2
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": PROMPT}) + "\n" for i in range(3)))
    out = tmp_path / "out.jsonl"
    args = ["batch", str(prompts), "-o", str(out), "-m", str(gemma_cache), "--rpc", pair, "--raw", "-t", "0"]
    batch = llmrun([*args, "-n", str(TOKENS), "--parallel", "1", "--ctx", "512"], env=env)
    assert batch.returncode == 0, batch.stderr[-2000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["q0", "q1", "q2"]
    assert all(line["text"] == reference for line in lines)
    bench = llmrun(
        ["bench", "-m", str(gemma_cache), "--rpc", pair, "-p", "16", "-n", "8", "-r", "1", "--json"], env=env
    )
    assert bench.returncode == 0, bench.stderr[-2000:]
    (row,) = json.loads(bench.stdout)
    assert row["tg_tokens_per_s"] > 0 and row["pp_tokens_per_s"] > 0


def test_serve_answers_through_the_workers(pair: str, gemma_cache: Path, env: dict[str, str], reference: str) -> None:
    from openai import OpenAI

    with serving.running(["-m", str(gemma_cache), "--rpc", pair, "--ctx", "512", "--parallel", "1"], env) as (url, _):
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        answer = client.completions.create(model=model, prompt=PROMPT, max_tokens=TOKENS, temperature=0)
        assert answer.choices[0].text == reference
        again = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
        assert reference.startswith(again.choices[0].text)


def test_a_worker_killed_mid_answer_ends_the_run_with_one_line(
    bin_dir: Path | None, home: Path, gemma_cache: Path, env: dict[str, str]
) -> None:
    with workers.running(bin_dir, home, 2) as started:
        endpoints = ",".join(endpoint for endpoint, _ in started)
        args = ["-m", "llmrun", "run", "-m", str(gemma_cache), "1, 2, 3, 4,", "--raw", "-t", "0", "-n", "2000"]
        process = subprocess.Popen(
            [sys.executable, *args, "--ctx", "2048", "--rpc", endpoints],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=interruptible,
        )
        assert process.stdout is not None
        first = process.stdout.read(20)  # answering through both workers
        started[1][1].send_signal(signal.SIGKILL)
        out, err = process.communicate(timeout=120)
    text = err.decode(errors="replace")
    assert process.returncode == 1, text
    assert first and (first + out).decode(errors="replace").strip()  # what came before is kept
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    assert "RPC worker" in lines[0] and "Traceback" not in text


def test_a_worker_that_is_down_is_one_line_before_anything_loads(
    bin_dir: Path | None, home: Path, gemma_cache: Path, env: dict[str, str]
) -> None:
    with workers.running(bin_dir, home, 1) as started:
        endpoint, process = started[0]
        workers.stop(process)
        time.sleep(0.2)
        done = llmrun(["run", "-m", str(gemma_cache), "Hi", "--rpc", endpoint], env=env)
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: cannot reach the RPC worker at {endpoint}"), done.stderr
    assert "ggml-rpc-server --host 127.0.0.1" in done.stderr and len(done.stderr.strip().splitlines()) == 1
