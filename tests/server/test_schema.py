"""Schema-driven negative testing of a real `llmrun serve` process: schemathesis reads the server's
own /openapi.json and sends thousands of requests, valid and invalid, to every OpenAI and Ollama
route. No 5xx; every status documented; every 4xx body in the API's error shape; responses (JSON,
SSE events, Ollama's NDJSON) valid against the description; schema-violating requests refused;
afterwards /health still answers and the server's memory is back near where it started; every
request is answered within 30 s, the server's --request-timeout (20 s) bounding each.

The server runs a 64-token context so that a generated request answers fast; the check that
schema-valid requests are accepted is left out (an answer that would not fit the context, or a
tool that has no JSON Schema the decoder can enforce, is rightly refused)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support import serving

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = 200  # per operation and phase: over 2,000 requests in all
SERVER_TIMEOUT_S = 20  # serve --request-timeout: no request holds a slot longer
CLIENT_TIMEOUT_S = 30  # and none leaves schemathesis waiting


@pytest.fixture(scope="module")
def server(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("serve"))
    args = ["-m", str(smollm), "--ctx", "64", "--parallel", "2", "--request-timeout", str(SERVER_TIMEOUT_S)]
    with serving.running(args, env) as (url, process):
        yield url, process.pid


def requests_served(url: str) -> dict[str, float]:
    """Requests by status, from the server's own Prometheus counter."""
    text = httpx.get(url + "/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for status, value in re.findall(r'llmrun_requests_total\{[^}]*status="(\d+)"[^}]*\} ([0-9.e+]+)', text):
        counts[status] = counts.get(status, 0.0) + float(value)
    return counts


def test_schemathesis_finds_nothing(server: tuple[str, int], tmp_path: Path) -> None:
    url, pid = server
    httpx.post(url + "/v1/chat/completions", json={"model": "x", "messages": []}, timeout=30)  # warm up
    before = psutil.Process(pid).memory_info().rss
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            url + "/openapi.json",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            "1",
            "--no-color",
            "--request-timeout",
            str(CLIENT_TIMEOUT_S),  # a request the server has not answered by then fails the run
            "--generation-database",
            "none",
            "--suppress-health-check",
            "all",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "SCHEMATHESIS_HOOKS": "tests.server.schemathesis_hooks"},
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    counts = requests_served(url)
    assert sum(counts.values()) >= 2000, counts
    assert not any(status.startswith("5") for status in counts), counts
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    after = psutil.Process(pid).memory_info().rss
    assert after < before + 100 * 2**20, (before, after)  # nothing held on to, request after request
