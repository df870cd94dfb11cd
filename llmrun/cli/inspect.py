"""``llmrun tokenize`` and ``llmrun next``: the first stages of the pipeline, made visible."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmrun.cli import options as o
from llmrun.cli.run import plan, read_prompt
from llmrun.errors import UsageError

if TYPE_CHECKING:
    from llmrun.engine.plan import RunPlan


def _text_or_error(argument: str | None, command: str) -> str:
    text = read_prompt(argument)
    if not text:
        raise UsageError("no text given", f'pass it as an argument (llmrun {command} "Hello") or pipe it on stdin')
    return text


def local_plan(
    model: str | None, sampling: dict[str, Any], load_flags: dict[str, Any], force: bool, backend: str
) -> RunPlan:
    """A plan for a model loaded here: a remote engine has no logits or tensors to show, and says so."""
    run_plan = plan(model, sampling, load_flags, force, backend)
    if run_plan.backend == "remote":
        from llmrun.engine.plan import remote_refusal

        raise remote_refusal(run_plan.model.name, [e.url for e in run_plan.endpoints])
    return run_plan


def tokenize(
    text: Annotated[
        str | None, typer.Argument(help="Text to tokenize. Omitted or '-': read stdin.", show_default=False)
    ] = None,
    model: o.ModelOpt = None,
    special: Annotated[
        bool, typer.Option("--special", help="Read special-token markup in TEXT as special tokens.")
    ] = False,
    bos: Annotated[bool, typer.Option("--bos/--no-bos", help="Add the model's beginning-of-text token.")] = True,
    backend: o.BackendOpt = "auto",
    json_output: o.JsonOpt = False,
) -> None:
    """Show how a model splits text into tokens: ids, pieces, counts.

    Example: llmrun tokenize "안녕하세요, world 🦜"
    """
    from llmrun.backends.base import LoadParams
    from llmrun.cli import render, views
    from llmrun.decoding.tokens import spans
    from llmrun.engine.load import load_vocabulary
    from llmrun.engine.plan import locate
    from llmrun.models.registry import load_registry

    source = _text_or_error(text, "tokenize")
    located = locate(load_registry(), model, backend=backend)
    vocab = load_vocabulary(located.model.path, LoadParams(512, 1, 0, vocab_only=True), located.backend.backend)
    try:
        ids = vocab.tokenize(source, special=special, add_bos=bos and vocab.adds_bos)
        pieces = {i: vocab.token_bytes(i, special=True) for i in set(ids)}
    finally:
        vocab.close()
    groups = spans(ids, pieces.__getitem__)
    counted = len(ids) - (1 if bos and ids[:1] == [vocab.bos_id] else 0)
    ratio = len(source) / counted if counted else 0.0
    if json_output:
        render.print_json(
            {
                "model": located.model.name,
                "text": source,
                "count": len(ids),
                "characters": len(source),
                "characters_per_token": round(ratio, 3),
                "tokens": [
                    {"id": i, "piece": pieces[i].decode("utf-8", "replace"), "bytes": list(pieces[i])} for i in ids
                ],
                "spans": [{"ids": list(g.ids), "text": g.text, "byte_fallback": g.byte_fallback} for g in groups],
            }
        )
        return
    views.token_spans(groups)
    views.token_table(ids, pieces)
    render.note(
        f"{len(ids)} tokens ({counted} for the text) · {len(source)} characters · "
        f"{ratio:.2f} characters per token · {located.model.name}"
    )


def next_token(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt. Omitted or '-': read stdin.", show_default=False)
    ] = None,
    model: o.ModelOpt = None,
    top: Annotated[int, typer.Option("--top", help="How many candidates to show.", min=1, max=1000)] = 10,
    temperature: o.TemperatureOpt = None,
    top_k: o.TopKOpt = None,
    top_p: o.TopPOpt = None,
    min_p: o.MinPOpt = None,
    system: o.SystemOpt = None,
    raw: o.RawOpt = False,
    ctx: o.CtxOpt = None,
    threads: o.ThreadsOpt = None,
    backend: o.BackendOpt = "auto",
    force: o.ForceOpt = False,
    json_output: o.JsonOpt = False,
) -> None:
    """One forward pass: the most likely next tokens, and what temperature, top-k, top-p and min-p do to them.

    Example: llmrun next "The capital of France is" -t 0.7 --top-k 5
    """
    from llmrun.cli import render, views
    from llmrun.engine.inspection import next_token as compute
    from llmrun.engine.load import load, local
    from llmrun.engine.request import choose_template
    from llmrun.prompt.render import prompt_ids

    text = _text_or_error(prompt, "next")
    flags = o.sampling_values(locals())
    run_plan = local_plan(model, flags, o.load_values(ctx, threads, None), force, backend)
    with render.status(f"Loading {run_plan.model.name}…"):
        loaded = local(load(run_plan), "show its next-token distribution")  # refused above: never remote
        try:
            rendered, prompt_format = prompt_ids(loaded, choose_template(run_plan).own, text, system, raw)
            ids = rendered.ids
            result = compute(loaded, ids, run_plan.sampling, top)
        finally:
            loaded.close()
    params = run_plan.sampling
    if json_output:
        render.print_json(
            {
                "model": run_plan.model.name,
                "prompt_format": prompt_format,
                "prompt_tokens": result.prompt_tokens,
                "params": {k: params.to_dict()[k] for k in ("temperature", "top_k", "top_p", "min_p")},
                "entropy_bits": {"raw": round(result.raw_entropy, 4), "final": round(result.final_entropy, 4)},
                "survivors": result.survivors,
                "vocabulary": result.vocabulary,
                "candidates": [
                    {
                        "rank": c.rank,
                        "id": c.id,
                        "piece": c.piece.decode("utf-8", "replace"),
                        "raw": c.raw,
                        "tempered": c.tempered,
                        "final": c.final,
                        "removed_by": c.removed_by or None,
                    }
                    for c in result.candidates
                ],
            }
        )
        return
    views.next_token_table(result, params)
