"""Real server processes for tests and benchmarks: a free port, a hermetic home, waiting for /health, stopping.

No pytest here: the benchmarks start their servers with the same functions."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.helpers import interruptible


class DidNotStart(RuntimeError):
    """A server process that exited, or did not answer in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hermetic_env(home: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "LLMRUN_HOME": str(home / "llmrun"),
        "LLMRUN_CONFIG_DIR": str(home / "config"),
        "HF_HOME": str(home / "hf"),
        "HF_HUB_OFFLINE": "1",
        "OLLAMA_MODELS": str(home / "ollama-models"),
        "LMSTUDIO_MODELS": str(home / "lmstudio-models"),
    }
    env.pop("LLMRUN_API_KEY", None)
    return env


def start(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[str, subprocess.Popen[str]]:
    """``llmrun serve ARGS --port N`` in the background; its URL once /health answers."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "llmrun", "serve", *args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=interruptible,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(url + "/health", process, lambda: process.stderr.read() if process.stderr else "", timeout)
    return url, process


def wait_for(url: str, process: subprocess.Popen[Any], output: Callable[[], str], timeout: float = 120) -> None:
    """Until ``url`` answers 200; :class:`DidNotStart` (with ``output()``) if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DidNotStart(f"the server exited ({process.returncode}): {output()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise DidNotStart(f"the server did not answer {url} within {timeout:.0f} s: {output()}")


def stop(process: subprocess.Popen[Any], sig: int = signal.SIGINT, timeout: float = 30) -> None:
    """Signal a child (Ctrl-C by default) and wait for it; killed if it has not exited in ``timeout``."""
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def running(args: list[str], env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """:func:`start`, and Ctrl-C (waiting for it to exit) when the block ends, unless it already exited."""
    url, process = start(args, env)
    try:
        yield url, process
    finally:
        stop(process)
