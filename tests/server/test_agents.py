"""The real Claude Code (`@anthropic-ai/claude-code` from npm, pinned, installed once per machine) against a
real `llmrun serve` on the packaged Gemma 3 270M, offline, in a temporary HOME and folder: it runs to the
end and answers, and every request it sent was answered 200 (each field it sends is honoured or on the
documented list of those left aside: anything else would be a 400 that stops it)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import _machine_cache
from tests.support import agents, serving

pytestmark = pytest.mark.slow
KEY = "agent-key-0123456789"


@pytest.fixture(scope="module")
def claude() -> Path:
    try:
        return agents.installed(_machine_cache(), agents.CLAUDE_CODE, "claude")
    except agents.Unavailable as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def server(gemma_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("agents"))
    args = ["-m", str(gemma_cache), "--ctx", "32768", "--parallel", "1", "--api-key", KEY, "--max-tokens", "64"]
    with serving.running(args, env) as (url, _):
        yield url, gemma_cache.name


def statuses(url: str, endpoint: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    pattern = rf'^llmrun_requests_total\{{endpoint="{re.escape(endpoint)}",status="(\d+)"\}} ([0-9.e+]+)$'
    return {status: float(count) for status, count in re.findall(pattern, text, re.M)}


def test_claude_code_answers_through_the_messages_api(claude: Path, server: tuple[str, str], tmp_path: Path) -> None:
    url, model = server
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = agents.claude_env(home, url, KEY, model)
    done = subprocess.run(
        [str(claude), "-p", "Say hi.", "--model", model, "--max-turns", "1", "--output-format", "json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    seen = statuses(url, "/v1/messages")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], seen)
    report = json.loads(done.stdout)
    assert report.get("is_error") is False and isinstance(report.get("result"), str), report
    assert seen.get("200", 0) >= 1 and set(seen) == {"200"}, seen  # every request it sent was answered
