"""``llmrun launch claude|codex``: a coding agent on a local model.

Starts ``llmrun serve`` with the model on a free loopback port, behind a key made for this launch (so no
other program on the machine can use the server meanwhile), runs the agent pointing at it, and stops the
server when the agent exits, with the agent's exit code. Nothing of the agent's own configuration is
written: Claude Code gets its environment (the Anthropic Messages API), Codex CLI ``-c`` overrides on its
command line (a model provider on the Responses API) and the key in an environment variable.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from llmrun.cli import options as o
from llmrun.errors import UsageError


@dataclass(frozen=True, slots=True)
class Agent:
    binary: str
    package: str  # what installs it
    name: str


MAX_CTX = 32768
AGENTS = {
    "claude": Agent("claude", "@anthropic-ai/claude-code", "Claude Code"),
    "codex": Agent("codex", "@openai/codex", "Codex CLI"),
}
KEY_VARIABLE = "LLMRUN_LAUNCH_KEY"  # where Codex CLI reads the launch's key (its provider's env_key)
PROVIDER = "llmrun-launch"
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies
OFFLINE = {  # what the agent sends beyond the model: telemetry, error reports, update checks, side calls
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
}


def agent_env(base: dict[str, str], url: str, key: str, model: str) -> dict[str, str]:
    """Claude Code's environment: the server, its key, the model for its main and its side tasks (pure)."""
    return {
        **base,
        **OFFLINE,
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
    }


def codex_args(url: str, model: str, ctx: int) -> list[str]:
    """Codex CLI's ``-c`` overrides: llmrun as a model provider on the Responses API, the model and its
    context, no update check or analytics (pure; they go before any subcommand, such as ``exec``)."""
    provider = f'{{ name = "llmrun", base_url = "{url}/v1", env_key = "{KEY_VARIABLE}", wire_api = "responses" }}'
    settings = [
        f"model_providers.{PROVIDER}={provider}",
        f"model_provider={PROVIDER}",
        f"model={json.dumps(model)}",
        f"model_context_window={ctx}",
        "check_for_update_on_startup=false",
        "analytics.enabled=false",
    ]
    return [part for setting in settings for part in ("-c", setting)]


def launch(
    agent: Annotated[
        str, typer.Argument(help="The agent to run: claude (Claude Code) or codex (Codex CLI).", show_default=False)
    ],
    arguments: Annotated[
        list[str] | None, typer.Argument(help="The agent's own arguments, after --.", show_default=False)
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="An alias from models.toml or a path to a .gguf file. Default: the model `llmrun chat` uses.",
            rich_help_panel=o.LOADING,
            show_default=False,
        ),
    ] = None,
    ctx: Annotated[
        int | None,
        typer.Option(
            "--ctx",
            "-c",
            min=256,
            help="Context per request (an agent's first request is 10-20k tokens). Default: the model's trained "
            f"length, at most {MAX_CTX}.",
            rich_help_panel=o.LOADING,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a coding agent on a local model: llmrun serves the model, the agent talks to it.

    Examples:

      llmrun launch claude -m qwen3-coder:30b

      llmrun launch claude -m smollm2:135m -- -p "Say hi."

      llmrun launch codex -m gemma3:270m -- exec "Say hi."
    """
    found = AGENTS.get(agent)
    if found is None:
        raise UsageError(f"llmrun knows no agent {agent!r}", f"agents llmrun launches: {', '.join(AGENTS)}")
    binary = shutil.which(found.binary)
    if binary is None:
        raise UsageError(
            f"{found.name} is not installed ({found.binary} is not on PATH)", f"npm install -g {found.package}"
        )
    name = model or _default_chat()
    code = _run(found, binary, name, ctx or _trained(name), list(arguments or ()))
    raise typer.Exit(code)


def _default_chat() -> str:
    from llmrun.models.registry import default_model_name, load_registry

    registry = load_registry()
    return registry.default_chat or default_model_name(registry)[0]


def _trained(model: str) -> int:
    """The model's trained context length, at most :data:`MAX_CTX` (the server says what is wrong with a model
    that cannot be found)."""
    from llmrun.engine.plan import locate
    from llmrun.errors import LlmrunError
    from llmrun.models.registry import load_registry

    try:
        header = locate(load_registry(), model).header
    except LlmrunError:
        return MAX_CTX
    return min(int(header.arch_value("context_length") or 4096), MAX_CTX)


def _run(agent: Agent, binary: str, model: str, ctx: int, arguments: list[str]) -> int:
    """The server started, the agent run to its end, the server stopped: the agent's exit code."""
    from llmrun.cli import render

    key = secrets.token_hex(24)
    with tempfile.TemporaryDirectory(prefix="llmrun-launch-") as folder:
        key_file = Path(folder) / "key"
        key_file.write_text(key)
        key_file.chmod(0o600)
        port = _free_port()
        log = Path(folder) / "serve.log"
        command = [sys.executable, "-m", "llmrun", "serve", "-m", model, "--ctx", str(ctx), "--port", str(port)]
        command += ["--parallel", "1", "--api-key-file", str(key_file), "--no-ui"]
        with log.open("wb") as out:
            server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_dies_with_parent)
        try:
            url = f"http://127.0.0.1:{port}"
            with render.status(f"Loading {model}…"):
                _wait(url, server, log)
            served = _served_name(url, key)
            render.note(f"{model} served at {url} for this launch; starting the agent")
            if agent.binary == "codex":
                command = [binary, *codex_args(url, served, ctx), *arguments]
                env = {**os.environ, KEY_VARIABLE: key}
            else:
                command, env = [binary, "--model", served, *arguments], agent_env(dict(os.environ), url, key, served)
            return subprocess.run(command, env=env).returncode
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


def _dies_with_parent() -> None:
    """In the server's process before it starts: on Linux, SIGTERM when launch dies, however it dies (killed
    included), so no server is left holding the cores after an agent session."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(url: str, server: subprocess.Popen[bytes], log: Path, timeout: float = 600) -> None:
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            raise UsageError(f"the server did not start: {lines[-1] if lines else 'it exited'}", "check the model name")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise UsageError(f"the server did not answer within {timeout:.0f} s", "try a smaller model or --ctx")


def _served_name(url: str, key: str) -> str:
    """The name the server gives the model (a file's name for a path)."""
    import httpx

    listed = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10).json()["data"]
    return str(listed[0]["id"])
