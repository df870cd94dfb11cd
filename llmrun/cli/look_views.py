"""``llmrun look`` in the terminal: the token table, an attention heatmap, the heads overview, the lens grid.

Everything fits 80 columns for prompts of about 30 tokens; longer prompts show their last
positions (a heatmap's first column then sums the weight on the earlier keys). Weights are
drawn with shade characters as well as colour, so a piped or colourless view still reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from llmrun.cli.render import err_console, out_console
from llmrun.decoding.tokens import visible

if TYPE_CHECKING:
    from types import ModuleType

    from rich.console import Console
    from rich.style import Style

    from llmrun.look.view import Look

SHADES = " ·░▒▓█"


def _short(text: str, width: int) -> str:
    shown = visible(text)
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def _level(weight: float) -> int:
    """0…5, by the square root of a weight (so 1%, 9%, 25%, 49%, 72% are the steps)."""
    root = max(0.0, weight) ** 0.5
    return sum(root >= edge for edge in (0.1, 0.3, 0.5, 0.7, 0.85))


def _style(weight: float, hue: str = "attention") -> Style:
    from rich.color import Color
    from rich.style import Style

    t = min(1.0, max(0.0, weight) ** 0.5)
    if hue == "lens":
        rgb = (int(40 + 30 * t), int(60 + 160 * t), int(60 + 40 * t))
    else:
        rgb = (int(40 + 215 * t), int(50 + 130 * t), int(90 - 40 * t))
    return Style(color=Color.from_rgb(*rgb), bold=t > 0.7)


def show(
    look: Look,
    report: dict[str, Any],
    layer: int,
    head: int | None,
    query: int | None,
    top: int,
    reading: ModuleType,
    skip_first: bool = False,
) -> None:
    console = out_console()
    if skip_first:
        console.print(
            Text("attention without the first token, each row rescaled (--skip-first)", style="yellow"),
            soft_wrap=False,
        )
    _tokens(console, look, layer, head, top, reading)
    if look.neighbours:
        _neighbours(console, look)
    if layer in look.attention:
        _heatmap(console, look, layer, head, reading)
    chosen = query if query is not None else len(look.tokens) - 1
    if query is not None:
        _follow(console, look, chosen, head, top, reading)
    if len(look.attention) > 1:
        _overview(console, look, chosen, reading)
    _lens(console, look, report)
    for note in look.notes:
        err_console().print(f"note: {note}", style="yellow")
    seconds = look.seconds
    err_console().print(
        f"{len(look.tokens)} tokens · capture {seconds.get('capture', 0):.2f} s · lens {seconds.get('lens', 0):.2f} s"
        f" · embeddings {seconds.get('embeddings', 0):.2f} s · {look.model}",
        style="dim",
    )


def _title(console: Console, text: str, detail: str = "") -> None:
    from rich.text import Text

    line = Text("\n" + text, style="bold")
    if detail:
        line.append("  " + detail, style="dim")
    console.print(line, soft_wrap=False)


def _tokens(console: Console, look: Look, layer: int, head: int | None, top: int, reading: ModuleType) -> None:
    from rich.table import Table
    from rich.text import Text

    g = look.geometry
    shared = (
        f"{g.n_head_kv} K/V head{'s' if g.n_head_kv > 1 else ''} shared: grouped-query attention"
        if g.n_head_kv < g.n_head
        else "one K/V head each"
    )
    _title(
        console,
        "Tokens → vectors",
        f"{g.architecture} · {g.n_layer} layers × {g.n_head} heads ({shared}) · {g.n_embd} dimensions",
    )
    grid = Table(box=None, pad_edge=False, show_edge=False)
    grid.add_column("#", justify="right", style="dim")
    grid.add_column("id", justify="right")
    grid.add_column("token")
    grid.add_column("‖v‖", justify="right")
    weights = look.attention.get(layer)
    who = "heads averaged" if head is None else f"head {head}"
    if weights is not None:
        grid.add_column(f"attends to most (layer {layer}, {who})")
    for token in look.tokens:
        cells: list[Any] = [
            str(token.position),
            str(token.id),
            Text(_short(token.text, 14), style="bold"),
            f"{token.norm:.2f}",
        ]
        if weights is not None:
            row = reading.head_map(weights, head)[token.position]
            line = Text()
            for i, seen in enumerate(reading.strongest(row, top, token.position + 1)):
                if i:
                    line.append(" · ", style="dim")
                line.append(_short(look.tokens[seen.position].text, 10), style=_style(seen.weight))
                line.append(f" {seen.weight:.2f}", style="dim")
            cells.append(line)
        grid.add_row(*cells)
    console.print(grid)
    from llmrun.look.view import positions_line

    console.print(Text(positions_line(g), style="dim"), soft_wrap=False)


def _neighbours(console: Console, look: Look) -> None:
    from rich.text import Text

    words = {t.id: t.text for t in look.tokens}
    for token_id, near in look.neighbours.items():
        line = Text("Nearest to ", style="bold")
        line.append(repr(words.get(token_id) or (near and "?") or "?"), style="bold")
        line.append(f" (id {token_id}) by cosine: ", style="dim")
        for i, n in enumerate(near):
            if i:
                line.append(" · ", style="dim")
            line.append(_short(n.text, 14))
            line.append(f" {n.cosine:.2f}", style="dim")
        console.print(line, soft_wrap=False)


def _heatmap(console: Console, look: Look, layer: int, head: int | None, reading: ModuleType) -> None:
    from rich.text import Text

    weights = reading.head_map(look.attention[layer], head)
    n = len(look.tokens)
    label = 12
    fits = max(4, (console.width - label - 3) // 2)
    first = max(0, n - fits + 1) if n > fits else 0
    who = "heads averaged" if head is None else f"head {head}"
    _title(console, f"Attention, layer {layer} ({who})", "rows: each token (query) · columns: what it reads (keys)")
    if first:
        summary = f"the last {n - first} tokens; the first column sums the weight on the {first} before"
        console.print(Text(summary, style="dim"), soft_wrap=False)
    for q in range(first, n):
        line = Text(_short(look.tokens[q].text, label - 1).rjust(label - 1) + " ", style="bold")
        if first:
            earlier = float(weights[q, :first].sum())
            line.append(SHADES[_level(earlier)] * 2, style=_style(earlier))
            line.append("|", style="dim")
        for k in range(first, n):
            w = float(weights[q, k]) if k <= q else 0.0
            line.append(SHADES[_level(w)] * 2 if k <= q else "  ", style=_style(w))
        console.print(line, no_wrap=True)
    keys = Text(" " * label + ("   " if first else ""), style="dim")
    for k in range(first, n):
        keys.append(f"{k % 100:<2}")
    console.print(keys, no_wrap=True)
    steps = "  ".join(
        f"{shade} {edge}" for shade, edge in zip(SHADES[1:], ("1%", "9%", "25%", "49%", "72%+"), strict=True)
    )
    console.print(Text(f"scale: {steps}", style="dim"))


def _follow(console: Console, look: Look, query: int, head: int | None, top: int, reading: ModuleType) -> None:
    from rich.table import Table
    from rich.text import Text

    who = "heads averaged" if head is None else f"head {head}"
    token = look.tokens[query]
    _title(console, f"What {visible(token.text)!r} (#{query}) attends to, layer by layer", who)
    grid = Table(box=None, pad_edge=False, show_edge=False, show_header=False)
    grid.add_column("layer", justify="right", style="dim")
    grid.add_column("keys")
    for layer, seen in reading.follow(look.attention, query, top, head).items():
        line = Text()
        for i, a in enumerate(seen):
            if i:
                line.append(" · ", style="dim")
            line.append(_short(look.tokens[a.position].text, 12), style=_style(a.weight))
            line.append(f" {a.weight:.2f}", style="dim")
        grid.add_row(f"layer {layer}", line)
    console.print(grid)


def _overview(console: Console, look: Look, query: int, reading: ModuleType) -> None:
    from rich.text import Text

    g = look.geometry
    cell = max(2, min(8, (console.width - 10) // max(1, g.n_head) - 1))
    token = look.tokens[query]
    _title(
        console,
        f"Heads: the key {visible(token.text)!r} (#{query}) weighs most, per layer and head",
        "pick a head with --layer/--head",
    )
    header = Text(" " * 9, style="dim")
    for h in range(g.n_head):
        header.append(f"{('h' + str(h)) if cell >= 3 else str(h % 10)}".ljust(cell + 1))
    console.print(header, no_wrap=True)
    for layer, heads in reading.overview(look.attention, query).items():
        line = Text(f"layer {layer:>2} ", style="dim")
        for a in heads:
            shown = _short(look.tokens[a.position].text, cell) if cell >= 4 else SHADES[_level(a.weight)] * cell
            line.append(shown.ljust(cell), style=_style(a.weight))
            line.append(" ")
        console.print(line, no_wrap=True)


def _lens(console: Console, look: Look, report: dict[str, Any]) -> None:
    from rich.text import Text

    g = look.geometry
    n = len(look.tokens)
    cell = 9
    fits = max(1, (console.width - 10) // (cell + 1))
    first = max(0, n - fits)
    _title(
        console,
        "Logit lens: the top next token after each position, read from each layer",
        "final norm + output head on the layer's output; 'out' is the model's own (= llmrun next)",
    )
    header = Text(" " * 10, style="dim")
    for p in range(first, n):
        header.append(_short(look.tokens[p].text, cell).ljust(cell + 1), style="bold")
    console.print(header, no_wrap=True)
    rows = range(g.n_layer) if look.lens_shown else range(g.n_layer - 1, g.n_layer)
    for layer in rows:
        name = "out" if layer == g.n_layer - 1 else f"layer {layer}"
        line = Text(f"{name:>9} ", style="dim")
        for p in range(first, n):
            cell_data = report["lens"][layer][p]
            if cell_data is None:
                line.append("?".ljust(cell + 1), style="dim")
                continue
            line.append(_short(cell_data["text"], cell).ljust(cell), style=_style(cell_data["prob"], "lens"))
            line.append(" ")
        console.print(line, no_wrap=True)
    last = report["lens"][g.n_layer - 1][n - 1]
    console.print(
        Text(f"after the last token the model predicts {visible(last['text'])!r} ({last['prob']:.1%})", style="dim"),
        soft_wrap=False,
    )
