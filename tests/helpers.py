"""Running the CLI in-process (CliRunner) and as a real subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from typer.testing import CliRunner

from llmrun.cli.app import app


def invoke(args: Sequence[str], stdin: str | None = None, columns: int = 200) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``llmrun ARGS`` run in this process."""
    result = CliRunner().invoke(app, list(args), input=stdin, env={"COLUMNS": str(columns)})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def llmrun(
    args: Sequence[str], stdin: str | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m llmrun ARGS`` as a subprocess with pipes (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "llmrun", *args],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def interruptible() -> None:
    """``preexec_fn`` for a child the test will Ctrl-C: SIGINT back to its default, since a suite started
    in the background (``pytest &``) hands its children an ignored SIGINT, which Python then keeps."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
