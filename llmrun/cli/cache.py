"""``llmrun cache``: the KV store on disk (prefixes whose prefill later runs skip): list, remove, clear."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from llmrun.cli import options as o
from llmrun.errors import UsageError

app = typer.Typer(
    name="cache",
    help="The KV store: prompt prefixes kept on disk so later runs skip their prefill (ls, rm, clear).",
    no_args_is_help=True,
)


@app.command("ls")
def ls(json_output: o.JsonOpt = False) -> None:
    """Every kept prefix: its id, model, tokens, size and when it was last used (most recent first)."""
    from llmrun.cli import render
    from llmrun.models.kv_store import entries, store_dir
    from llmrun.units import format_bytes

    kept = sorted(entries(), key=lambda entry: entry.used, reverse=True)
    rows: list[dict[str, Any]] = [
        {
            "id": entry.path.stem[:12],
            "model": str(entry.label.get("model", "?")),
            "backend": str(entry.label.get("backend", "?")),
            "kv_type": str(entry.label.get("kv_type", "?")),
            "tokens": len(entry.tokens),
            "bytes": entry.size,
            "used": time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.used)),
        }
        for entry in kept
    ]
    total = sum(row["bytes"] for row in rows)
    if json_output:
        render.print_json({"directory": str(store_dir()), "bytes": total, "entries": rows})
        return
    if not rows:
        render.note(f"the KV store is empty ({store_dir()})")
        return
    render.table(
        f"KV store: {len(rows)} prefixes, {format_bytes(total)} in {store_dir()}",
        ["id", "model", "backend", "KV", "tokens", "size", "last used"],
        [
            (r["id"], r["model"], r["backend"], r["kv_type"], f"{r['tokens']:,}", format_bytes(r["bytes"]), r["used"])
            for r in rows
        ],
        stdout=True,
    )


@app.command("rm")
def rm(
    targets: Annotated[
        list[str],
        typer.Argument(help="Prefix ids (from `llmrun cache ls`, or their first characters) or model names."),
    ],
) -> None:
    """Remove kept prefixes by id, or every prefix of a model."""
    from llmrun.cli import render
    from llmrun.models.kv_store import entries
    from llmrun.units import format_bytes

    kept = list(entries())
    chosen = {}
    for target in targets:
        matched = [
            e for e in kept if e.label.get("model") == target or (len(target) >= 4 and e.path.stem.startswith(target))
        ]
        if not matched:
            raise UsageError(f"nothing in the KV store matches {target!r}", "`llmrun cache ls` lists ids and models")
        chosen.update({entry.path: entry for entry in matched})
    size = sum(entry.size for entry in chosen.values())
    for path in chosen:
        path.unlink(missing_ok=True)
    render.note(f"removed {len(chosen)} prefix{'es' if len(chosen) != 1 else ''} ({format_bytes(size)})")


@app.command("clear")
def clear() -> None:
    """Remove every kept prefix."""
    from llmrun.cli import render
    from llmrun.models.kv_store import remove
    from llmrun.units import format_bytes

    count, size = remove()
    render.note(f"removed {count} prefix{'es' if count != 1 else ''} ({format_bytes(size)})")
