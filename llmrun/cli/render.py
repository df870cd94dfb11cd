"""Everything llmrun shows in a terminal; the only module that imports Rich.

The answer goes to stdout, everything else (spinners, stats, warnings, errors) to
stderr, so pipes stay clean. When a stream is not a terminal it gets plain text:
no colour codes and no spinners.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import IO, Any, Protocol

from rich.console import Console
from rich.table import Table
from rich.text import Text


@cache
def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def error(message: str, hint: str = "") -> None:
    """One line: what is wrong, then what to do."""
    line = Text("error: ", style="bold red")
    line.append(message)
    if hint:
        line.append(" — ", style="dim")
        line.append(hint, style="yellow")
    err_console().print(line)


def warn(message: str) -> None:
    line = Text("warning: ", style="bold yellow")
    line.append(message)
    err_console().print(line)


def note(message: str) -> None:
    err_console().print(Text(message, style="dim"))


class Status(Protocol):
    def update(self, status: str) -> None: ...

    def stop(self) -> None: ...


class _NoStatus:
    def update(self, status: str) -> None:
        pass

    def stop(self) -> None:
        pass


class _RichStatus:
    def __init__(self, live: Any) -> None:
        self._live = live

    def update(self, status: str) -> None:
        self._live.update(Text(status, style="dim"))

    def stop(self) -> None:
        self._live.stop()


@contextmanager
def status(message: str) -> Iterator[Status]:
    """A spinner on stderr while ``message`` is true; nothing when stderr is not a terminal."""
    console = err_console()
    if not console.is_terminal:
        yield _NoStatus()
        return
    with console.status(Text(message, style="dim"), spinner="dots") as live:
        yield _RichStatus(live)


class TokenPrinter:
    """Writes streamed text to stdout as it arrives (flushed, so pipes see it live)."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.wrote = False
        self.last = ""

    def write(self, text: str) -> None:
        if not text:
            return
        self.out.write(text)
        self.out.flush()
        self.wrote = True
        self.last = text[-1]

    def finish(self) -> None:
        """End the answer on its own line."""
        if self.wrote and self.last != "\n":
            self.out.write("\n")
        self.out.flush()


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, header: bool = True) -> None:
    """A small table on stderr (plain aligned text when stderr is not a terminal)."""
    grid = Table(
        title=title or None, title_justify="left", show_edge=False, box=None, pad_edge=False, show_header=header
    )
    for index, column in enumerate(columns):
        grid.add_column(column, style="dim" if index == 0 else None, no_wrap=index == 0)
    for row in rows:
        grid.add_row(*(str(cell) for cell in row))
    err_console().print(grid)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()
