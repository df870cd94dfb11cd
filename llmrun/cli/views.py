"""The pipeline and model views as tables: tokens, the next-token distribution, a model's facts and
memory plan, benchmarks, the store, retrieved passages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llmrun.cli.render import err_console, out_console, table, table_console

if TYPE_CHECKING:
    from rich.console import Console


def prompt_view(model: Any, ids: Sequence[int], console: Console | None = None, images: Sequence[int] = ()) -> None:
    """The prompt exactly as the model reads it, its special tokens highlighted (on stderr unless given);
    ``images``: where each image sits (before that token), shown as ``[image N]``."""
    from rich.text import Text

    from llmrun.prompt.render import prompt_spans

    console = console or err_console()
    bounds = [0, *images, len(ids)]
    specials = 0
    text = Text()
    for number in range(len(bounds) - 1):
        if number:
            text.append(f"[image {number}]", style="bold black on cyan")
        spans = prompt_spans(model, ids[bounds[number] : bounds[number + 1]])
        specials += sum(1 for _, special in spans if special)
        for piece, special in spans:
            text.append(piece, style="bold magenta" if special else None)
    shown = f", {len(images)} image{'s' if len(images) > 1 else ''}" if images else ""
    console.print(Text(f"── prompt: {len(ids)} tokens, {specials} special (highlighted){shown} ──", style="dim"))
    console.print(text)
    console.print(Text("── end of prompt ──", style="dim"))


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
        (
            "tool calls",
            "generic (the template shows none: tools described in a system message, calls as one JSON answer)"
            if facts["tool_calls"]["dialect"] == "generic"
            else f"{facts['tool_calls']['dialect']} (as {facts['tool_calls']['family']} write them)",
        ),
        ("images", f"yes, through {facts['mmproj']}" if facts.get("mmproj") else "no projector (text only)"),
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
