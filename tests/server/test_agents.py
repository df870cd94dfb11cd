"""The real Claude Code (`@anthropic-ai/claude-code` from npm, pinned, installed once per machine) against real
`llmrun serve` processes, offline, in a temporary HOME and folder. Every request it sends must be answered
200: each field it sends is honoured or on the documented list of those left aside (anything else would be a
400 that stops it).

- SmolLM2-135M-Instruct (it ends its answers), Claude Code's tools off (its prompt is then ~7,800 tokens,
  within SmolLM2's 8,192): it runs to the end, exits 0 and answers.
- Gemma 3 270M (a 32k context for Claude Code's whole first request: its system prompt and a dozen tools,
  ~13,000 tokens): its calls come back to Claude Code as tool_use blocks, Claude Code sends their results
  back, and the second turn reads the first's prefix from the prompt cache. (A 270M base model calls tools
  but does not finish a task: the run ends at the turn limit, which Claude Code reports as such.)
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    started: list[Any] = []

    def start(model: Path, *args: str) -> str:
        env = serving.hermetic_env(tmp_path_factory.mktemp("agents"))
        url, process = serving.start(["-m", str(model), "--parallel", "1", "--api-key", KEY, *args], env)
        started.append(process)
        return url

    yield start
    for process in started:
        serving.stop(process)


def statuses(url: str, endpoint: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    pattern = rf'^llmrun_requests_total\{{endpoint="{re.escape(endpoint)}",status="(\d+)"\}} ([0-9.e+]+)$'
    return {status: float(count) for status, count in re.findall(pattern, text, re.M)}


def run_claude(claude: Path, url: str, model: str, folder: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    home, work = folder / "home", folder / "work"
    home.mkdir()
    work.mkdir()
    done = subprocess.run(
        [str(claude), "-p", "Say hi.", "--model", model, "--output-format", "json", *args],
        cwd=work,
        env=agents.claude_env(home, url, KEY, model),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"claude printed no JSON report ({done.returncode}): {done.stdout[-1000:]} {done.stderr[-1000:]}")
    return done.returncode, report, done.stderr


def test_claude_code_runs_to_the_end_and_answers(claude: Path, served: Any, smollm: Path, tmp_path: Path) -> None:
    url = served(smollm, "--ctx", "8192")
    code, report, err = run_claude(claude, url, smollm.name, tmp_path, "--tools", "", "--max-turns", "1")
    assert code == 0, (report, err)
    assert report["is_error"] is False and report["subtype"] == "success" and report["stop_reason"] == "end_turn"
    assert report["result"].strip()
    assert set(statuses(url, "/v1/messages")) == {"200"}


def test_claude_code_calls_tools_and_sends_their_results_back(
    claude: Path, served: Any, gemma_cache: Path, tmp_path: Path
) -> None:
    url = served(gemma_cache, "--ctx", "32768", "--max-tokens", "128")
    _, report, err = run_claude(claude, url, gemma_cache.name, tmp_path, "--max-turns", "2")
    seen = statuses(url, "/v1/messages")
    assert set(seen) == {"200"} and seen["200"] >= 2, (seen, report, err)  # the tool results' turn answered too
    assert report.get("api_error_status") is None and report["num_turns"] >= 2, report
    assert report["stop_reason"] in ("tool_use", "end_turn")
    if report["stop_reason"] == "tool_use":  # the model called a tool each turn: Claude Code refused to run it
        assert report["terminal_reason"] == "max_turns" and report["permission_denials"]
    usage = report["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 10_000  # the agent's whole prompt, read
    assert usage["cache_read_input_tokens"] > 0  # the later turn started from the first turn's KV cells
