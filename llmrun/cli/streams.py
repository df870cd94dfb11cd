"""Streamed answers in the terminal: plain or coloured by probability, a reasoning model's reasoning
dimmed on stderr, Markdown rendered block by block as it arrives."""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any

from llmrun.cli.render import err_console

if TYPE_CHECKING:
    from rich.console import Console


PROBABILITY_STYLES = ((0.9, "green"), (0.5, "default"), (0.2, "yellow"), (0.05, "dark_orange"), (0.0, "red"))


def probability_style(p: float) -> str:
    return next(style for floor, style in PROBABILITY_STYLES if p >= floor)


class TokenPrinter:
    """Writes streamed text to stdout as it arrives (flushed, so pipes see it live).

    With ``colour_by_probability`` each piece is coloured by the probability the model
    gave its token (on a terminal; plain text elsewhere).
    """

    def __init__(self, out: IO[str] | None = None, *, colour_by_probability: bool = False) -> None:
        self.out = out or sys.stdout
        self.wrote = False
        self.last = ""
        self._console: Console | None = None
        if colour_by_probability:
            from rich.console import Console

            self._console = Console(file=self.out, highlight=False, soft_wrap=True)

    def write(self, text: str, probability: float | None = None) -> None:
        if not text:
            return
        if self._console is not None and probability is not None:
            from rich.text import Text

            self._console.print(Text(text, style=probability_style(probability)), end="")
        else:
            self.out.write(text)
        self.out.flush()
        self.wrote = True
        self.last = text[-1]

    def finish(self) -> None:
        """End the answer on its own line."""
        if self.wrote and self.last != "\n":
            self.out.write("\n")
        self.out.flush()


class ReasoningPrinter:
    """A reasoning model's reasoning, dimmed on stderr (stdout keeps only the answer, for pipes);
    ``hidden`` shows nothing."""

    def __init__(self, *, hidden: bool = False) -> None:
        self.hidden = hidden
        self.wrote = False
        self.open = False

    def write(self, text: str) -> None:
        if self.hidden or not text:
            return
        from rich.text import Text

        console = err_console()
        if not self.wrote:
            console.print(Text("Thinking…", style="dim italic"))
        console.print(Text(text, style="dim italic"), end="")
        self.wrote = self.open = True

    def finish(self) -> None:
        """The reasoning is over: end it on its own line, with a blank line before the answer."""
        from rich.text import Text

        if self.open:
            err_console().print(Text("\n…done thinking.\n", style="dim italic"))
            sys.stdout.flush()
            self.open = False


def probability_legend() -> None:
    from rich.text import Text

    legend = Text("token probability: ", style="dim")
    labels = ("≥ 90%", "50–90%", "20–50%", "5–20%", "< 5%")
    for (_, style), label in zip(PROBABILITY_STYLES, labels, strict=True):
        legend.append("■ " + label + "  ", style=style)
    err_console().print(legend)


class MarkdownStream:
    """Markdown rendered as it streams, without redrawing the whole reply on every token.

    Finished blocks (ended by a blank line outside a code fence) are printed once, for
    good; only the block being written is redrawn in a Rich Live region. The cost of a
    token is bounded by the size of its block, not of the reply: no flicker of earlier
    text and no cost that grows with the square of the reply.
    """

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console

        self.console = console or Console(highlight=False)
        self.current = ""
        self.wrote = False
        self._live: Any = None

    def write(self, text: str, probability: float | None = None) -> None:
        if not text:
            return
        self.wrote = True
        self.current += text
        while (end := block_end(self.current)) is not None:
            block, self.current = self.current[:end], self.current[end:]
            self._commit(block)
        self._redraw()

    def finish(self) -> None:
        if self.current.strip():
            self._commit(self.current)
        self.current = ""
        self._stop()

    def _commit(self, block: str) -> None:
        from rich.markdown import Markdown

        self._stop()
        if block.strip():
            self.console.print(Markdown(block))

    def _redraw(self) -> None:
        from rich.live import Live
        from rich.markdown import Markdown

        if not self.current.strip():
            return
        if self._live is None:
            self._live = Live(console=self.console, transient=True, auto_refresh=False)
            self._live.start()
        self._live.update(Markdown(self.current), refresh=True)

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def block_end(text: str) -> int | None:
    """Where the first complete Markdown block ends (after a blank line outside a code fence)."""
    fence = False
    position = 0
    for line in text.splitlines(keepends=True):
        position += len(line)
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and line.strip() == "" and line.endswith("\n") and text[: position - len(line)].strip():
            return position
    return None
