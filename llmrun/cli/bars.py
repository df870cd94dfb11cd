"""Progress on stderr for long work: Rich bars on a terminal, a plain line every 10% elsewhere
(without importing Rich then). The consoles and the terminal test are :mod:`llmrun.cli.render`'s."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from llmrun.cli.render import err_console, stderr_is_terminal


@contextmanager
def batch_progress(total: int) -> Iterator[Any]:
    """A progress bar on stderr (prompts done, aggregate tokens/s); plain lines when not a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = err_console()
    if not console.is_terminal:
        step = max(1, total // 10)

        def plain(done: int, tps: float) -> None:
            if done % step == 0 or done == total:
                console.print(f"{done}/{total} prompts, {tps:.1f} tok/s", highlight=False)

        yield plain
        return
    columns = (
        TextColumn("[dim]batch"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tps]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("batch", total=total, tps="")

        def update(done: int, tps: float) -> None:
            bar.update(task, completed=done, tps=f"{tps:.1f} tok/s")

        yield update


@contextmanager
def download_progress() -> Iterator[Any]:
    """A progress callback (file, bytes done, total): a Rich bar per file with bytes, speed and
    ETA on a terminal; a plain line every 10% otherwise."""

    def columns() -> tuple[Any, ...]:
        from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn

        progress = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        return (*progress, TimeRemainingColumn())

    with _progress(columns, "{name}: {done:,} of {total:,} bytes") as update:
        yield update


@contextmanager
def _progress(columns: Callable[[], Sequence[Any]], plain_line: str) -> Iterator[Any]:
    """A (name, done, total) callback: one Rich bar per name, or ``plain_line`` every 10% off a terminal
    (written without Rich, which is not imported then)."""
    if not stderr_is_terminal():
        shown: dict[str, int] = {}

        def plain(name: str, done: int, total: int) -> None:
            step = int(10 * done / total) if total else 0
            if shown.get(name, -1) < step:
                shown[name] = step
                sys.stderr.write(plain_line.format(name=name, done=done, total=total) + "\n")
                sys.stderr.flush()

        yield plain
        return
    from rich.progress import Progress

    with Progress(*columns(), console=err_console()) as bar:
        tasks: dict[str, Any] = {}

        def update(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total or None)
            bar.update(tasks[name], completed=done, total=total or None)

        yield update


@contextmanager
def work_progress() -> Iterator[Any]:
    """A progress callback (what, done, total) for counted work (tensors): a Rich bar with
    the count and elapsed time on a terminal; a plain line every 10% otherwise."""

    def columns() -> tuple[Any, ...]:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        return (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())

    with _progress(columns, "{name}: {done} of {total}") as update:
        yield update
