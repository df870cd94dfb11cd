"""Running the CLI in-process (CliRunner) and as a real subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from typer.testing import CliRunner

from llmrun.cli.app import build

app = build()


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


ROUNDING = 0.5  # log-probabilities computed in another batch shape move by up to ~0.3 on the packaged Gemma


def agree_up_to_rounding(got: Sequence[Any], want: Sequence[Any], rounding: float = ROUNDING) -> None:
    """Two greedy answers (Tokens with their top log-probabilities) computed in different batch
    shapes: token by token the same log-probabilities within ``rounding``, and the same choice until
    ``want`` meets a near-tie (its top two within ``rounding``), where they may part."""
    assert got and want
    for mine, theirs in zip(got, want, strict=False):
        wanted = {c.id: c.logprob for c in theirs.top}
        shared = [c for c in mine.top if c.id in wanted]  # the tails of near-equal candidates may swap
        assert theirs.top[0].id in {c.id for c in shared}, "the uncached choice is not among the candidates"
        assert all(abs(c.logprob - wanted[c.id]) < rounding for c in shared), (mine.top, theirs.top)
        if mine.id != theirs.id:
            assert theirs.top[0].logprob - theirs.top[1].logprob < rounding, "parted where the choice was clear"
            return
    assert len(got) == len(want)
