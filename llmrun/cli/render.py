"""Everything llmrun shows in a terminal but progress bars (:mod:`llmrun.cli.bars`); with that, the
only module that imports Rich.

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
from typing import IO, TYPE_CHECKING, Any, Protocol

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


def prompt_view(model: Any, ids: Sequence[int], console: Console | None = None) -> None:
    """The prompt exactly as the model reads it, its special tokens highlighted (on stderr unless given)."""
    from rich.text import Text

    from llmrun.prompt.render import prompt_spans

    console = console or err_console()
    spans = prompt_spans(model, ids)
    specials = sum(1 for _, special in spans if special)
    text = Text()
    for piece, special in spans:
        text.append(piece, style="bold magenta" if special else None)
    console.print(Text(f"── prompt: {len(ids)} tokens, {specials} special (highlighted) ──", style="dim"))
    console.print(text)
    console.print(Text("── end of prompt ──", style="dim"))


def probability_legend() -> None:
    from rich.text import Text

    legend = Text("token probability: ", style="dim")
    labels = ("≥ 90%", "50–90%", "20–50%", "5–20%", "< 5%")
    for (_, style), label in zip(PROBABILITY_STYLES, labels, strict=True):
        legend.append("■ " + label + "  ", style=style)
    err_console().print(legend)


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

_SPAN_STYLES = ("black on #a6e3a1", "black on #89b4fa", "black on #f9e2af", "black on #f5c2e7", "black on #94e2d5")


def token_spans(groups: Sequence[Any]) -> None:
    """The text as coloured token segments (one colour per token; a split character in one)."""
    from rich.console import Console
    from rich.text import Text

    from llmrun.decoding.tokens import visible

    line = Text()
    for index, group in enumerate(groups):
        style = _SPAN_STYLES[index % len(_SPAN_STYLES)]
        shown = group.text if group.text.strip() or not group.text else visible(group.text)
        line.append(shown.replace("\n", "↵\n"), style=style + (" underline" if group.byte_fallback else ""))
    Console(highlight=False, soft_wrap=True).print(line)


def token_table(ids: Sequence[int], pieces: dict[int, bytes]) -> None:
    from llmrun.decoding.tokens import visible

    rows = []
    for index, token_id in enumerate(ids):
        data = pieces[token_id]
        try:
            shown = visible(data.decode("utf-8"))
            kind = ""
        except UnicodeDecodeError:
            shown = " ".join(f"<0x{b:02X}>" for b in data)
            kind = "byte (part of a character)"
        rows.append((index, token_id, shown, kind))
    table("", ["#", "id", "piece", ""], rows, stdout=True)


def probability_bar(p: float, width: int = 20) -> str:
    cells = p * width
    full = int(cells)
    return "█" * full + ("▌" if cells - full >= 0.5 else "")


def next_token_table(result: Any, params: Any) -> None:
    """Candidates for the next token at each sampling stage, with bars."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from llmrun.decoding.tokens import visible

    temperature = "greedy" if params.greedy else f"T={params.temperature:g}"
    grid = Table(box=None, pad_edge=False, show_edge=False, title_justify="left")
    for name, justify in (
        ("#", "right"),
        ("token", "left"),
        ("id", "right"),
        ("raw p", "right"),
        ("", "left"),
        (f"{temperature} p", "right"),
        ("final p", "right"),
        ("", "left"),
        ("removed by", "left"),
    ):
        grid.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in result.candidates:
        removed = bool(c.removed_by)
        grid.add_row(
            str(c.rank),
            Text(visible(c.piece.decode("utf-8", "replace")), style="dim strike" if removed else "bold"),
            str(c.id),
            f"{c.raw:.2%}",
            Text(probability_bar(c.raw), style="blue"),
            f"{c.tempered:.2%}",
            f"{c.final:.2%}",
            Text(probability_bar(c.final), style="dim" if removed else "green"),
            Text(c.removed_by, style="red"),
        )
    console = Console(highlight=False)
    console.print(grid)
    err_console().print(
        Text(
            f"prompt {result.prompt_tokens} tokens · entropy {result.raw_entropy:.2f} bits raw → "
            f"{result.final_entropy:.2f} bits sampled · {result.survivors:,} of {result.vocabulary:,} tokens survive "
            f"(top-k {params.top_k}, top-p {params.top_p:g}, min-p {params.min_p:g}, {temperature})",
            style="dim",
        )
    )


def model_facts(facts: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from llmrun.units import format_bytes

    window = facts["sliding_window"]
    rows = [
        ("model", facts["name"]),
        ("file", f"{facts['path']} ({format_bytes(facts['file_size'])})"),
        ("sha256", facts["sha256"] or "not recorded (llmrun did not download or assemble this file)"),
        ("architecture", f"{facts['architecture']}" + (f" ({facts['model_name']})" if facts["model_name"] else "")),
        ("parameters", f"{facts['parameters'] / 1e6:,.0f} M"),
        ("trained context", f"{facts['context_length']:,} tokens" if facts["context_length"] else "unknown"),
        ("layers", f"{facts['layers']} ({facts['kv_heads']} KV heads × {facts['head_dim']} dims)"),
        ("sliding window", f"{window['window']} tokens on {window['layers']} layers" if window else "none"),
        ("vocabulary", f"{facts['vocabulary']:,} tokens"),
        ("chat template", "yes" if facts["chat_template"] else "no (plain completion)")
        if not facts.get("embedding")
        else ("embedding model", facts["embedding"]),
        ("license", facts["license"] or "unknown"),
    ]
    out = Console(highlight=False)
    grid = Table(box=None, show_header=False, pad_edge=False)
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    for row in rows:
        grid.add_row(*(str(cell) for cell in row))
    out.print(grid)
    types = Table(title="\nweights by tensor type", title_justify="left", box=None, pad_edge=False)
    for column in ("type", "tensors", "size"):
        types.add_column(column, justify="left" if column == "type" else "right")
    for name, value in facts["tensor_types"].items():
        types.add_row(name, str(value["tensors"]), format_bytes(value["bytes"]))
    out.print(types)


def memory_plan(memory: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from llmrun.units import format_bytes

    grid = Table(
        title=f"\nmemory plan at {memory['context']:,} tokens of context "
        f"({format_bytes(memory['available_bytes'])} available)",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    for column in ("KV type", "weights", "KV cache", "(windowed)", "compute", "total", "fits", "max context"):
        grid.add_column(column, justify="left" if column == "KV type" else "right", no_wrap=True)
    for kv, p in memory["by_kv_type"].items():
        windowed = p["kv_cache_windowed_bytes"]
        grid.add_row(
            kv,
            format_bytes(p["weights_bytes"]),
            format_bytes(p["kv_cache_bytes"]),
            "" if windowed in (None, p["kv_cache_bytes"]) else format_bytes(windowed),
            format_bytes(p["compute_bytes"]),
            format_bytes(p["total_bytes"]),
            Text("yes", style="green") if p["fits"] else Text("no", style="red"),
            f"{p['largest_context']:,}",
        )
    out = Console(highlight=False)
    out.print(grid)
    out.print(
        Text(
            "KV cache = layers × KV heads × (K + V dims) × context × bytes per element. Sliding-window layers are "
            "kept full-size, as llama.cpp does by default (swa_full); 'windowed' is their size when they are not.",
            style="dim",
        )
    )


def bench_table(rows: Sequence[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from llmrun.units import format_bytes

    grid = Table(box=None, pad_edge=False)
    for column in ("model", "backend", "KV", "threads", "test", "t/s", "time to first token", "peak RSS"):
        grid.add_column(column, justify="left" if column in ("model", "backend", "KV", "test") else "right")
    for row in rows:
        for test, key in ((f"pp{row['n_prompt']}", "pp"), (f"tg{row['n_gen']}", "tg")):
            ttft = f"{row['ttft_s'] * 1000:.0f} ± {row['ttft_stdev'] * 1000:.0f} ms" if key == "pp" else ""
            grid.add_row(
                row["model"],
                row["backend"],
                row["kv_type"],
                str(row["threads"]),
                test,
                f"{row[f'{key}_tokens_per_s']:.1f} ± {row[f'{key}_stdev']:.1f}",
                ttft,
                format_bytes(row["peak_rss_bytes"]) if key == "pp" else "",
            )
        if "speedup" in row:  # --draft: greedy generation with the draft against without it
            share = f", {row['acceptance']:.0%} accepted" if row["acceptance"] is not None else ", nothing drafted"
            grid.add_row(
                row["model"],
                row["backend"],
                row["kv_type"],
                str(row["threads"]),
                f"draft {row['draft']}",
                f"{row['draft_tokens_per_s']:.1f} vs {row['plain_tokens_per_s']:.1f}",
                f"{row['speedup']:.2f}x{share}",
                "" if row["same_output"] else "output differs (near-tie)",
            )
    Console(highlight=False).print(grid)


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


def models_table(rows: Sequence[dict[str, Any]]) -> None:
    from rich.table import Table

    from llmrun.models.quants import quant_of
    from llmrun.units import format_bytes

    grid = Table(box=None, pad_edge=False)
    for column in ("name", "format", "quant", "size", "pulled", "location"):
        grid.add_column(column, justify="right" if column == "size" else "left", overflow="fold")
    for row in rows:
        grid.add_row(
            row["name"] + ("" if row["present"] else " (files missing)"),
            row["format"],
            row.get("quant") or quant_of(row["files"][0]) or "",
            format_bytes(row["size"]) if row["size"] is not None else "",
            row["pulled"][:16].replace("T", " "),
            row["path"],
        )
    table_console().print(grid)


def hits(found: Sequence[Any], preview_lines: int = 6) -> None:
    """Retrieved chunks, best first: rank, score, source, then the start of the text (stdout)."""
    from rich.text import Text

    console = out_console()
    for rank, hit in enumerate(found, start=1):
        line = Text(f"{rank:>2}  ", style="bold")
        line.append(f"{hit.score:.3f}  ", style="cyan")
        line.append(hit.source, style="green")
        console.print(line)
        shown = hit.text.splitlines()
        body = "\n".join(f"    {row}" for row in shown[:preview_lines])
        if len(shown) > preview_lines:
            body += f"\n    … ({len(shown) - preview_lines} more lines)"
        console.print(Text(body, style="dim"))


def sources(used: Sequence[Any]) -> None:
    """The passages an answer was given from, after it (stdout: they belong to the answer)."""
    from rich.text import Text

    console = out_console()
    console.print(Text("\nSources:", style="bold"))
    for number, hit in enumerate(used, start=1):
        line = Text(f"  [{number}] ")
        line.append(hit.source, style="green")
        line.append(f"  ({hit.score:.2f})", style="dim")
        console.print(line)


def context(prompt: str) -> None:
    """The prompt text retrieval built, as injected (stderr, so the answer stays alone on stdout)."""
    from rich.text import Text

    console = err_console()
    console.rule("context given to the model", style="dim")
    console.print(Text(prompt, style="dim"))
    console.rule(style="dim")
