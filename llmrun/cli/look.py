"""``llmrun look``: the stages between the tokens and the next-token distribution, made visible."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmrun.cli import options as o
from llmrun.cli.inspect import _text_or_error, local_plan
from llmrun.errors import UsageError

if TYPE_CHECKING:
    from llmrun.backends.base import LoadedModel
    from llmrun.backends.trace import Geometry

VIEWS = "What to look at"


def _check_output(path: Path) -> None:
    """An --html path that cannot be written fails before the model loads."""
    import os

    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"--html {path} is a directory", "give a file name, such as look.html")
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"--html {path}: {parent} is not a folder", "give a path in a folder")
    if not parent.is_dir():
        raise UsageError(f"--html {path}: the folder {parent} does not exist", "create it, or write elsewhere")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"--html {path} cannot be written here", "choose a path you can write to")


def look(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt. Omitted or '-': read stdin.", show_default=False)
    ] = None,
    model: o.ModelOpt = None,
    layer: Annotated[
        int | None,
        typer.Option(
            "--layer", "-l", help="The layer whose attention map to draw. Default: the last.", rich_help_panel=VIEWS
        ),
    ] = None,
    head: Annotated[
        int | None,
        typer.Option("--head", help="One attention head to draw. Default: the heads averaged.", rich_help_panel=VIEWS),
    ] = None,
    from_token: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Follow one token through the layers: what it attends to in each. A token's text "
            "('it', 'it#2' for the second), or '#N' for position N. Default: the last token, in the heads view.",
            rich_help_panel=VIEWS,
            show_default=False,
        ),
    ] = None,
    neighbours: Annotated[
        list[str] | None,
        typer.Option(
            "--neighbours",
            help="The tokens nearest to this one in the model's embedding space (cosine). Repeatable.",
            rich_help_panel=VIEWS,
            show_default=False,
        ),
    ] = None,
    skip_first: Annotated[
        bool,
        typer.Option(
            "--skip-first",
            help="Rank and draw attention without the first token, the rest rescaled: most heads park their "
            "weight there when nothing else matters (an attention sink). --json keeps the raw weights.",
            rich_help_panel=VIEWS,
        ),
    ] = False,
    top: Annotated[
        int,
        typer.Option(
            "--top", help="Alternatives per lens cell and keys per token.", min=1, max=20, rich_help_panel=VIEWS
        ),
    ] = 3,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Also write one self-contained interactive page (no network): hover a token to see its "
            "attention, pick layers and heads, read the lens grid.",
            rich_help_panel=VIEWS,
            show_default=False,
        ),
    ] = None,
    system: o.SystemOpt = None,
    raw: o.RawOpt = False,
    ctx: o.CtxOpt = None,
    threads: o.ThreadsOpt = None,
    backend: o.BackendOpt = "auto",
    force: o.ForceOpt = False,
    json_output: o.JsonOpt = False,
) -> None:
    """One forward pass, looked into: tokens as vectors, attention, and the prediction forming layer by layer.

    Shows each token's embedding, what every token attends to (a heatmap for one layer and head, the
    layers × heads overview, one token followed through the layers with --from) and the logit lens: the
    final norm and output head applied to every layer's output. Runs on the quantized model as it is stored.

    Example: llmrun look --raw --from it "The animal didn't cross the street because it was too tired"
    """
    from functools import partial

    from llmrun.backends.trace import looking
    from llmrun.cli import render
    from llmrun.engine.load import load, local
    from llmrun.engine.request import choose_template
    from llmrun.files import atomic_write_text
    from llmrun.look import attention as reading
    from llmrun.look.report import to_json
    from llmrun.look.view import look as run_look
    from llmrun.look.view import piece_text
    from llmrun.prompt.render import prompt_ids

    text = _text_or_error(prompt, "look")
    if html is not None:
        _check_output(html)
    run_plan = local_plan(model, {}, o.load_values(ctx, threads, None), force, backend)
    with render.status(f"Loading {run_plan.model.name}…"):
        loaded = local(load(run_plan), "show what happens inside its forward pass")
    try:
        rendered, _ = prompt_ids(loaded, choose_template(run_plan).own, text, system, raw)
        ids = rendered.ids
        pieces = [piece_text(loaded, i) for i in ids]
        query = _position(pieces, from_token, "--from") if from_token is not None else None
        asked = [_neighbour_id(loaded, pieces, ids, word) for word in neighbours or ()]
        geometry = looking(loaded).geometry()
        _check_range("--layer", layer, geometry.n_layer, "layers")
        _check_range("--head", head, geometry.n_head, "heads")
        with render.status(f"Looking inside {run_plan.model.name} ({len(ids)} tokens)…"):
            seen = run_look(
                loaded,
                run_plan.model.name,
                ids,
                layers=_layers(geometry, len(ids), layer),
                top=top,
                neighbours_of=asked,
            )
            report = to_json(seen, partial(piece_text, loaded))
    finally:
        loaded.close()
    if html is not None:
        from llmrun.look.page import page

        atomic_write_text(html, page(report))
    if json_output:
        render.print_json(report)
        return
    from llmrun.cli import look_views

    chosen = layer if layer is not None else geometry.n_layer - 1
    if skip_first:
        seen.attention = reading.without_first(seen.attention)
    look_views.show(seen, report, chosen, head, query, top, reading, skip_first)
    if html is not None:
        render.note(f"wrote {html} — open it in a browser")


def _check_range(flag: str, value: int | None, count: int, what: str) -> None:
    if value is not None and not 0 <= value < count:
        raise UsageError(f"{flag} {value} is out of range: this model has {count} {what}", f"use 0 to {count - 1}")


def _layers(geometry: Geometry, n_tokens: int, layer: int | None) -> list[int] | None:
    """All layers' attention, or only the drawn layer's when all of them would not fit the budget."""
    from llmrun.backends.trace import attention_layers

    try:
        attention_layers(None, geometry, n_tokens)
    except UsageError:
        if layer is None:
            raise
        return [layer]
    return None


def _position(pieces: list[str], wanted: str, flag: str) -> int:
    from llmrun.look.attention import find_token

    try:
        return find_token(pieces, wanted)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}", "give a token as it appears in the prompt, or #N for position N") from None


def _neighbour_id(model: LoadedModel, pieces: list[str], ids: list[int], word: str) -> int:
    """A token named by its text: one of the prompt's, else the word as a single token of the vocabulary."""
    from llmrun.look.attention import find_token

    try:
        return ids[find_token(pieces, word)]
    except ValueError:
        pass
    for form in (word, f" {word}", word.strip()):
        found = model.tokenize(form, add_bos=False)
        if len(found) == 1:
            return int(found[0])
    raise UsageError(
        f"--neighbours: {word!r} is more than one token for this model",
        "give one token (`llmrun tokenize` shows how text splits)",
    )
