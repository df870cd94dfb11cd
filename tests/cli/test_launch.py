"""`llmrun launch claude`: the real Claude Code (pinned, from npm, installed once per machine) run on a local
model that launch serves for it, offline, in a temporary HOME; and the one-line refusals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import _machine_cache
from tests.support import agents, serving
from tests.support.helpers import invoke

pytestmark = pytest.mark.slow
LAUNCH = [sys.executable, "-m", "llmrun", "launch", "claude", "-m", "smollm2:135m", "--"]


def test_an_unknown_agent_or_a_missing_one_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = invoke(["launch", "aider"])
    assert code == 2 and "claude, codex" in err and "Traceback" not in err
    monkeypatch.setenv("PATH", "/nonexistent")
    for agent, package in (("claude", "@anthropic-ai/claude-code"), ("codex", "@openai/codex")):
        code, _, err = invoke(["launch", agent])
        assert code == 2 and f"npm install -g {package}" in err and len(err.strip().splitlines()) == 1


def test_claude_code_runs_on_the_model_launch_serves(tmp_path: Path) -> None:
    try:
        claude = agents.installed(_machine_cache(), agents.CLAUDE_CODE, "claude")
    except agents.Unavailable as exc:
        pytest.fail(str(exc))
    env = serving.hermetic_env(tmp_path)
    Path(env["LLMRUN_CONFIG_DIR"]).mkdir(parents=True)
    (Path(env["LLMRUN_CONFIG_DIR"]) / "models.toml").write_text(agents.GREEDY_SMOLLM)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {**env, "HOME": str(home), "PATH": f"{claude.parent}{os.pathsep}{env['PATH']}"}
    env = {k: v for k, v in env.items() if not k.startswith("ANTHROPIC_")}
    done = subprocess.run(
        [*LAUNCH, "-p", "Say hi.", "--tools", "", "--max-turns", "1", "--output-format", "json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)  # the agent's own output, on stdout; launch's notes on stderr
    assert report["is_error"] is False and report["result"].strip()
    found = re.search(r"served at (http://127\.0\.0\.1:\d+)", done.stderr)
    assert found is not None, done.stderr
    with pytest.raises(httpx.ConnectError):  # the server launch started stopped with the agent
        httpx.get(found.group(1) + "/health", timeout=5)


def test_codex_runs_on_the_model_launch_serves(tmp_path: Path) -> None:
    """Codex CLI set up for a small model (docs/agents.md) through launch's own provider settings: nothing
    written to its config (its CODEX_HOME holds no config.toml after), an answer, exit 0."""
    try:
        codex = agents.installed(_machine_cache(), agents.CODEX, "codex")
    except agents.Unavailable as exc:
        pytest.fail(str(exc))
    env = serving.hermetic_env(tmp_path)
    Path(env["LLMRUN_CONFIG_DIR"]).mkdir(parents=True)
    (Path(env["LLMRUN_CONFIG_DIR"]) / "models.toml").write_text(agents.GREEDY_SMOLLM)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    env = {**agents.codex_env(env, home, "unused"), "PATH": f"{codex.parent}{os.pathsep}{env['PATH']}"}
    instructions = home / "instructions.md"
    instructions.write_text("You are a helpful assistant. Answer briefly.\n")
    small = [*agents.CODEX_SMALL, "-c", f"model_instructions_file={json.dumps(str(instructions))}"]
    asked = ["exec", "--skip-git-repo-check", "--json", "Write a haiku about the sea."]
    done = subprocess.run(
        [sys.executable, "-m", "llmrun", "launch", "codex", "-m", "smollm2:135m", "--", *small, *asked],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    answers = [e["item"]["text"] for e in events if e.get("type") == "item.completed" and "text" in e["item"]]
    assert answers and answers[-1].strip(), done.stdout[-2000:]
    assert not (home / ".codex" / "config.toml").exists()


def test_a_killed_launch_leaves_no_server_behind(tmp_path: Path) -> None:
    """launch killed outright (SIGKILL: no cleanup of its own runs) while its agent runs: the server it started
    goes too, instead of holding the cores."""
    env = serving.hermetic_env(tmp_path)
    Path(env["LLMRUN_CONFIG_DIR"]).mkdir(parents=True)
    (Path(env["LLMRUN_CONFIG_DIR"]) / "models.toml").write_text(agents.GREEDY_SMOLLM)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "claude").write_text("#!/bin/sh\nsleep 300\n")  # an agent that runs until stopped
    (fake / "claude").chmod(0o755)
    env = {**env, "PATH": f"{fake}{os.pathsep}{env['PATH']}"}
    launch = subprocess.Popen(
        [sys.executable, "-m", "llmrun", "launch", "claude", "-m", "smollm2:135m"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert launch.stderr is not None
    line = ""
    while "served at" not in line:
        line = launch.stderr.readline()
        assert line or launch.poll() is None, "launch ended before serving"
    url = re.search(r"(http://127\.0\.0\.1:\d+)", line).group(1)  # type: ignore[union-attr]
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    launch.kill()
    launch.wait()
    for _ in range(100):
        try:
            httpx.get(url + "/health", timeout=1)
        except httpx.ConnectError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the server outlived the launch that started it")
    subprocess.run(["pkill", "-f", str(fake / "claude")], check=False)
