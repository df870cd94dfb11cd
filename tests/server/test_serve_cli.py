"""`llmrun serve` one request at a time (--parallel 1), with --keep-alive, stopped with SIGTERM;
and the command's refusals, which need no model."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.test_openai import QUESTION
from tests.support import serving
from tests.support.helpers import invoke, llmrun

pytestmark = pytest.mark.slow
ONE_AT_A_TIME = ["--parallel", "1", "--ctx", "1024", "--keep-alive", "1s"]


@pytest.fixture(scope="module")
def one_at_a_time(
    smollm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    url, process = serving.start(
        ["-m", str(smollm), *ONE_AT_A_TIME], serving.hermetic_env(tmp_path_factory.mktemp("s1"))
    )
    yield url, process
    if process.poll() is None:
        process.kill()


def test_greedy_at_parallel_1_equals_llmrun_run_and_idle_models_unload(
    one_at_a_time: tuple[str, subprocess.Popen[str]], smollm: Path
) -> None:
    url, _ = one_at_a_time
    body = {
        "model": str(smollm),
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 24,
        "temperature": 0,
    }
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
    result = llmrun(["run", "-m", str(smollm), "-t", "0", "-n", "24", "--json", QUESTION])
    assert result.returncode == 0, result.stderr
    assert answer["choices"][0]["message"]["content"] == json.loads(result.stdout)["text"]
    deadline = time.monotonic() + 20  # --keep-alive 1s; the server looks every 5 s
    while httpx.get(url + "/health").json()["models"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert httpx.get(url + "/health").json()["models"] == []
    again = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()  # loaded again on demand
    assert again["choices"][0]["message"]["content"] == answer["choices"][0]["message"]["content"]


def test_sigterm_stops_it_cleanly(one_at_a_time: tuple[str, subprocess.Popen[str]]) -> None:
    _, process = one_at_a_time
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert "Traceback" not in (process.stderr.read() if process.stderr else "")


def test_an_open_bind_needs_a_key_and_bad_options_are_one_line(tmp_path: Path) -> None:
    code, _, err = invoke(["serve", "--host", "0.0.0.0"])
    assert code == 2 and "no API key" in err and "--no-auth" in err
    code, _, err = invoke(["serve", "--keep-alive", "soon"])
    assert code == 2 and "not a duration" in err
    code, _, err = invoke(["serve", "--api-key", "short"])
    assert code == 2 and "at least 8 characters" in err
    empty = tmp_path / "key"
    empty.write_text("\n")
    code, _, err = invoke(["serve", "--api-key-file", str(empty)])
    assert code == 2 and "is empty" in err
    code, _, err = invoke(["serve", "-m", "no-such-model"])
    assert code != 0 and "unknown model" in err and "Traceback" not in err


def test_a_taken_port_is_refused_before_loading() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        code, _, err = invoke(["serve", "--port", str(port)])
        assert code == 2 and f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err
        assert time.monotonic() - started < 5  # before any model loads
