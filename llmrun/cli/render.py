"""The terminal's consoles, one-line messages (errors, warnings, notes), spinners and small tables.

With :mod:`~llmrun.cli.streams` (answers as they stream), :mod:`~llmrun.cli.views` (the pipeline and
model views), :mod:`~llmrun.cli.look_views` (``look``) and :mod:`~llmrun.cli.bars` (progress), the only
modules that import Rich.

The answer goes to stdout, everything else (spinners, stats, warnings, errors) to
stderr, so pipes stay clean. When a stream is not a terminal it gets plain text:
no colour codes and no spinners.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console


@cache
def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def out_console() -> Console:
    """A console on stdout, for commands that print their answer through Rich."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def table_console() -> Console:
    """Tables on stdout: as wide as the terminal, or as ``COLUMNS`` says; piped without it they
    never wrap — one row a line, for ``grep`` and ``awk``."""
    import os

    from rich.console import Console

    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=UNWRAPPED if piped else None)


UNWRAPPED = 1_000_000


def error(message: str, hint: str = "") -> None:
    """One line: what is wrong, then what to do."""
    from rich.text import Text

    line = Text("error: ", style="bold red")
    line.append(_worded(message))
    if hint:
        line.append(" — ", style="dim")
        line.append(_worded(hint), style="yellow")
    err_console().print(line)


def warn(message: str) -> None:
    from rich.text import Text

    line = Text("warning: ", style="bold yellow")
    line.append(_worded(message))
    err_console().print(line)


class _WarningLines(logging.Handler):
    """A logger's warnings as warning lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        warn(record.getMessage())


def show_warnings(logger: str) -> None:
    """What core code logs as a warning on ``logger`` (``llmrun.kv``: a damaged KV store file removed), shown
    as warning lines; the ``llmrun`` loggers are otherwise silent unless --debug (once per process)."""
    target = logging.getLogger(logger)
    if not any(isinstance(handler, _WarningLines) for handler in target.handlers):
        target.addHandler(_WarningLines(logging.WARNING))


def note(message: str) -> None:
    from rich.text import Text

    err_console().print(Text(_worded(message), style="dim"))


def _worded(text: str) -> str:
    """Parameters that core code names (`n_ctx`) as the flags that set them (--ctx)."""
    from llmrun.api.flags import FLAGS
    from llmrun.errors import word

    return word(text, FLAGS)


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
        from rich.text import Text

        self._live.update(Text(status, style="dim"))

    def stop(self) -> None:
        self._live.stop()


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal, as Rich decides it (FORCE_COLOR, TTY_COMPATIBLE …), without importing
    Rich when it plainly is not one (a script's pipe or file: the common one-shot case, kept fast)."""
    import os

    if not sys.stderr.isatty() and not any(os.environ.get(v) for v in ("FORCE_COLOR", "TTY_COMPATIBLE")):
        return False
    return bool(err_console().is_terminal)


@contextmanager
def status(message: str) -> Iterator[Status]:
    """A spinner on stderr while ``message`` is true; nothing when stderr is not a terminal."""
    if not stderr_is_terminal():
        yield _NoStatus()
        return
    from rich.text import Text

    with err_console().status(Text(message, style="dim"), spinner="dots") as live:
        yield _RichStatus(live)


def table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, header: bool = True, stdout: bool = False
) -> None:
    """A small table, on stderr unless it is the command's answer (plain text when not a terminal)."""
    from rich.table import Table

    grid = Table(
        title=title or None, title_justify="left", show_edge=False, box=None, pad_edge=False, show_header=header
    )
    for index, column in enumerate(columns):
        grid.add_column(column, style="dim" if index == 0 else None, no_wrap=index == 0)
    for row in rows:
        grid.add_row(*(str(cell) for cell in row))
    (table_console() if stdout else err_console()).print(grid)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()


# --- pipeline views ------------------------------------------------------------
