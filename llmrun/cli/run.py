"""``llmrun run``: one prompt in, one streamed answer out."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmrun.cli import options as o
from llmrun.errors import LlmrunError, UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from llmrun.decoding.speculative import Draft
    from llmrun.engine.plan import RunPlan
    from llmrun.engine.result import Result
    from llmrun.rag.store import Hit
    from llmrun.structured import Format


def read_prompt(argument: str | None) -> str:
    """The prompt from the argument, stdin, or both (``cat notes | llmrun run "Summarize:"``).

    Piped stdin is read whenever stdin is not a terminal, and a terminal when the
    argument is '-' (type, then Ctrl-D); trailing newlines are dropped.
    """
    stdin = sys.stdin
    wanted = stdin is not None and (argument == "-" or not stdin.isatty())
    piped = stdin.read().rstrip("\n") if wanted and stdin is not None else ""
    if argument in (None, "-"):
        return piped
    if piped.strip():
        return f"{argument}\n\n{piped}"
    return argument or ""


def run(
    prompt: Annotated[
        str | None,
        typer.Argument(
            help="The prompt. Omitted or '-': read stdin; given with piped stdin: put before it.", show_default=False
        ),
    ] = None,
    model: o.ModelOpt = None,
    temperature: o.TemperatureOpt = None,
    top_k: o.TopKOpt = None,
    top_p: o.TopPOpt = None,
    min_p: o.MinPOpt = None,
    repeat_penalty: o.RepeatPenaltyOpt = None,
    repeat_last_n: o.RepeatLastNOpt = None,
    presence_penalty: o.PresencePenaltyOpt = None,
    frequency_penalty: o.FrequencyPenaltyOpt = None,
    seed: o.SeedOpt = None,
    max_tokens: o.MaxTokensOpt = None,
    stop: o.StopOpt = None,
    system: o.SystemOpt = None,
    raw: o.RawOpt = False,
    template: o.TemplateOpt = None,
    think: o.ThinkOpt = None,
    hide_thinking: o.HideThinkingOpt = False,
    show_prompt: Annotated[
        bool,
        typer.Option(
            "--show-prompt",
            help="Print the exact prompt the model reads, special tokens highlighted, to stderr.",
            rich_help_panel=o.TEMPLATES,
        ),
    ] = False,
    ctx: o.CtxOpt = None,
    threads: o.ThreadsOpt = None,
    gpu_layers: o.GpuLayersOpt = None,
    backend: o.BackendOpt = "auto",
    kv_bits: o.KvBitsOpt = None,
    flash_attn: o.FlashAttnOpt = None,
    show_special: o.ShowSpecialOpt = False,
    max_kv_size: o.MaxKvSizeOpt = None,
    rpc: o.RpcOpt = None,
    rpc_allow_remote: o.RpcAllowRemoteOpt = False,
    draft: o.DraftOpt = None,
    draft_tokens: o.DraftTokensOpt = None,
    kv_cache_size: o.KvCacheSizeOpt = None,
    no_kv_cache: o.NoKvCacheOpt = False,
    force: o.ForceOpt = False,
    stats: o.StatsOpt = False,
    json_output: o.JsonOpt = False,
    show_params: o.ShowParamsOpt = False,
    show_probs: Annotated[
        bool,
        typer.Option(
            "--show-probs", help="Colour each token by its probability (with a legend).", rich_help_panel=o.OUTPUT
        ),
    ] = False,
    logprobs: Annotated[
        int,
        typer.Option(
            "--logprobs",
            min=0,
            max=100,
            help="With --json: each token's log-probability and the N most likely alternatives.",
            rich_help_panel=o.OUTPUT,
        ),
    ] = 0,
    answer_format: o.FormatOpt = None,
    schema: o.SchemaOpt = None,
    grammar: o.GrammarOpt = None,
    rag: o.RagOpt = None,
    k: o.TopChunksOpt = 4,
    min_score: o.MinScoreOpt = -1.0,
    show_context: Annotated[
        bool,
        typer.Option(
            "--show-context", help="With --rag: print the passages given to the model.", rich_help_panel=o.RETRIEVAL
        ),
    ] = False,
    store: o.StoreOpt = None,
    endpoint: o.EndpointOpt = None,
    image: o.ImageOpt = None,
    mmproj: o.MmprojOpt = None,
    image_max_tokens: o.ImageMaxTokensOpt = None,
) -> None:
    """Run one prompt and stream the answer.

    Examples:

      llmrun run "The capital of France is"

      cat notes.txt | llmrun run "Summarize:" -t 0 --stats

      llmrun run --rag notes "How do I rotate the backup keys?"

      llmrun run --schema person.json "Invent a person" | jq .name

      llmrun run -m gemma3:4b --mmproj mmproj.gguf --image cat.png "What is in this picture?"

      llmrun run --endpoint http://gpu1:8000/v1 -m Qwen/Qwen3-8B "Hello"
    """
    flags = o.sampling_values(locals())
    chosen = o.template_choice(template)
    constrained = o.response_format(answer_format, schema, grammar)
    check_format(constrained)
    if logprobs and not json_output:
        raise UsageError(
            "--logprobs goes with --json", "add --json, or use --show-probs to see probabilities as colours"
        )
    from llmrun.cli.images import read_images

    images = read_images(image or (), prompt)
    text = read_prompt(prompt)
    if not text.strip() and not show_params:
        raise UsageError(
            "no prompt given", 'pass it as an argument (llmrun run "Hello") or pipe it: echo Hello | llmrun run'
        )
    if show_context and not rag:
        raise UsageError("--show-context goes with --rag", "add --rag COLLECTION")
    load_flags = o.load_values(
        ctx, threads, gpu_layers, kv_bits, max_kv_size, rpc, rpc_allow_remote, flash_attn, show_special
    )
    run_plan = plan(
        model,
        flags,
        load_flags,
        force,
        backend,
        draft=o.draft_choice(draft, draft_tokens),
        endpoints=endpoint or (),
        kv_cache=o.kv_cache_choice(kv_cache_size, no_kv_cache),
    )
    run_plan = with_projector(run_plan, images, mmproj, image_max_tokens)
    if run_plan.backend == "remote" and show_prompt:
        raise UsageError("--show-prompt shows a local model's prompt; a remote engine renders its own", "drop it")
    if show_params:
        _show_params(run_plan, system, raw)
        if not text.strip():
            return
    retrieval = None
    if rag:
        from llmrun.cli.index import retrieve

        retrieval = Retrieval(retrieve(rag, text, k, store, min_score), show_context)
    output = Output(stats, json_output, show_probs, logprobs, hide_thinking, show_prompt)
    _generate(run_plan, text, Prompting(system, raw, chosen, think), output, retrieval, constrained, images)


def with_projector(
    run_plan: RunPlan, images: tuple[bytes, ...], mmproj: Path | None, image_max_tokens: int | None
) -> RunPlan:
    """The plan with its projector (--mmproj, else the one its listing names), which images need; a model
    given images without one is one line."""
    import dataclasses

    source = "command line"
    listed = run_plan.model.projector
    if mmproj is None and listed is not None:
        mmproj, source = listed
    if mmproj is not None and not (mmproj.is_file() or (run_plan.backend == "mlx" and mmproj.is_dir())):
        raise UsageError(f"the projector {mmproj} does not exist", "give the model's mmproj GGUF file")
    if images and mmproj is None:
        hint = "give a vision model's projector with --mmproj FILE (its mmproj GGUF)"
        if run_plan.backend == "mlx":
            hint = "run an MLX vision model (its config.json has a vision_config), or a GGUF with --mmproj FILE"
        raise UsageError(f"{run_plan.model.name} does not see images: it has no projector", hint)
    if run_plan.backend == "remote" and (images or mmproj):
        raise UsageError("images go to a local model for now", "drop --endpoint, or --image")
    if mmproj is None:
        return run_plan
    return dataclasses.replace(run_plan, mmproj=mmproj, mmproj_source=source, image_max_tokens=image_max_tokens)


def check_format(constrained: Format | None) -> None:
    """A schema or grammar llmrun cannot enforce fails here, before the model loads; where it is enforced
    less strictly than written (an unknown ``format``, ``oneOf``), a note says so."""
    if constrained is None:
        return
    from llmrun.cli import render
    from llmrun.structured.grammar import format_notes

    for line in format_notes(constrained):
        render.note(f"note: {line}")


def plan(
    model: str | None,
    sampling: dict[str, Any],
    load_flags: dict[str, Any],
    force: bool,
    backend: str = "auto",
    context_cap: int | None = None,
    draft: Draft | None = None,
    endpoints: Sequence[str] = (),
    kv_cache: tuple[int | None, str] = (None, "default"),
) -> RunPlan:
    """Plan a run behind a spinner; warnings shown (bad values reach the error table, worded for their flags)."""
    from llmrun.cli import bars, render
    from llmrun.engine.load import load_defaults
    from llmrun.engine.plan import plan_run
    from llmrun.models.registry import load_registry
    from llmrun.sysinfo import available_memory

    registry = load_registry()
    with bars.download_progress() as progress:
        run_plan = plan_run(
            registry,
            model,
            sampling,
            load_flags,
            force=force,
            available_memory=available_memory,
            load_defaults=load_defaults,
            progress=progress,
            backend=backend,
            context_cap=context_cap,
            draft=draft,
            endpoints=endpoints,
            kv_cache=kv_cache,
        )
    for warning in run_plan.warnings:
        render.warn(warning)
    if run_plan.kv_cache:
        render.show_warnings("llmrun.kv")
    return run_plan


def _show_params(run_plan: RunPlan, system: str | None, raw: bool) -> None:
    from llmrun.cli import render

    settings = run_plan.settings()
    rows = [(o.FLAG_FOR_FIELD.get(name, name), _shown(name, value), source) for name, value, source in settings]
    if system is None and run_plan.system and run_plan.model.foreign:
        rows.append(("--system", run_plan.system, f"{run_plan.model.foreign.source}'s system prompt"))
    else:
        rows.append(("--system", system if system is not None else "", "command line" if system else "default"))
    rows.append(("--raw", raw, "command line" if raw else "default"))
    if run_plan.backend != "remote":  # (a remote engine reads calls its own way)
        from llmrun.engine.request import choose_template
        from llmrun.structured.dialects import dialect_for

        templates = choose_template(run_plan)
        rows.append(("tool calls", dialect_for(templates.conversation).name, templates.conversation_source))
    render.table("Effective settings", ["setting", "value", "source"], rows)


def _shown(name: str, value: Any) -> Any:
    """A setting's value as its flag spells it."""
    if name == "seed" and value is None:
        return "random (per run)"
    bits = {kv: bits for bits, kv in o.KV_BITS_TYPES.items()}
    if name == "kv_type" and value in bits:
        return f"{bits[value]} ({value})"
    return value


@dataclass(frozen=True, slots=True)
class Retrieval:
    hits: list[Hit]
    show_context: bool


@dataclass(frozen=True, slots=True)
class Output:
    stats: bool
    json: bool
    show_probs: bool
    logprobs: int
    hide_thinking: bool = False
    show_prompt: bool = False


@dataclass(frozen=True, slots=True)
class Prompting:
    """How the prompt reaches the model: system prompt, plain or templated, which template, reasoning."""

    system: str | None = None
    raw: bool = False
    template: tuple[str, str] | None = None  # --template: the template and where it came from
    think: bool | None = None


def _generate(
    run_plan: RunPlan,
    text: str,
    prompting: Prompting,
    output: Output,
    retrieval: Retrieval | None = None,
    constrained: Format | None = None,
    images: tuple[bytes, ...] = (),
) -> None:
    import math

    from llmrun.cli import render, streams, views
    from llmrun.engine.core import Engine
    from llmrun.engine.load import local
    from llmrun.engine.request import Request, request_ids
    from llmrun.engine.result import Result
    from llmrun.remote.model import RemoteModel
    from llmrun.sysinfo import peak_rss

    started = time.perf_counter()
    printer = streams.TokenPrinter(colour_by_probability=output.show_probs)
    thoughts = streams.ReasoningPrinter(hidden=output.hide_thinking or output.json)
    system, raw = prompting.system, prompting.raw
    engine = Engine(template=prompting.template)
    result: Result | None = None
    with render.status(f"Loading {run_plan.model.name}…") as spinner:
        entry = engine.load(run_plan)
        spinner.update("Generating…" if output.json else "Reading the prompt…")
        try:
            used: tuple[Hit, ...] = ()
            if retrieval is not None:
                text, used = _ground(run_plan, entry.model, text, system, retrieval, spinner)
            want = max(output.logprobs, 1 if output.show_probs else 0)
            request = Request(
                prompt=text,
                params=run_plan.sampling,
                system=system,
                raw=raw,
                logprobs=want,
                response_format=constrained,
                think=prompting.think,
                images=images,
            )
            if output.show_prompt:
                spinner.stop()
                model = local(entry.model, "show the prompt it reads")
                shown = request_ids(model, entry.templates, request).prompt
                views.prompt_view(model, shown.ids, images=shown.images)
            try:
                for event in engine.complete(entry, request):
                    if isinstance(event, Result):
                        result = event
                    elif not output.json:
                        if event.reasoning or event.text:
                            spinner.stop()
                        thoughts.write(event.reasoning)
                        if event.text:
                            thoughts.finish()
                        probability = math.exp(event.logprob) if event.logprob is not None else None
                        printer.write(event.text, probability)
            except KeyboardInterrupt:
                spinner.stop()
                thoughts.finish()
                printer.finish()
                raise
        finally:
            engine.close()
    thoughts.finish()
    printer.finish()
    assert result is not None
    report = _report(run_plan, result, entry.load_seconds, peak_rss(), time.perf_counter() - started)
    if isinstance(entry.model, RemoteModel) and entry.model.served:
        report["model"] = entry.model.served
    report["template"] = entry.templates.prompt_source if result.prompt_format == "chat template" else "none"
    if not output.logprobs:
        report.pop("logprobs", None)
    if retrieval is not None:
        from llmrun.cli.index import hit_rows

        report["sources"] = hit_rows(list(used))
        if used and not output.json:
            views.sources(used)
    if output.json:
        render.print_json(report)
    if output.show_probs and not output.json:
        streams.probability_legend()
    if output.stats:
        _print_stats(report)
    if result.valid is False:
        raise incomplete(result)


def incomplete(result: Result) -> LlmrunError:
    """The error for a constrained answer that did not come out whole (the text was still shown)."""
    if result.finish_reason == "eos":  # whole, but not what the schema says (what decoding approximated: oneOf)
        return LlmrunError(
            "the answer does not match the schema as written (it matched more than one `oneOf` branch)",
            "make the `oneOf` branches exclusive, or use `anyOf`",
        )
    why = {"length": "`max_tokens`", "context": "the context", "stop": "a stop string"}.get(result.finish_reason)
    hint = "raise `max_tokens`" if result.finish_reason == "length" else "raise `n_ctx` or shorten the prompt"
    if result.finish_reason == "stop":
        hint = "drop `stop`: the format already says where the answer ends"
    what = "JSON" if result.structured in ("json", "schema") else "under the grammar"
    return LlmrunError(f"the answer is not complete {what}: {why or 'generation'} ended it first", hint)


def _ground(
    run_plan: RunPlan, model: Any, question: str, system: str | None, retrieval: Retrieval, spinner: Any
) -> tuple[str, tuple[Hit, ...]]:
    """The question with its retrieved passages, trimmed to the context; shown with --show-context."""
    from llmrun.cli import views
    from llmrun.cli.index import grounded_prompt, token_counter

    extra = token_counter(model)(system) if system else 0
    context = grounded_prompt(question, retrieval.hits, model, run_plan.load.n_ctx, run_plan.sampling.max_tokens, extra)
    if retrieval.show_context:
        spinner.stop()
        views.context(context.prompt)
    return context.prompt, context.used


def _report(run_plan: RunPlan, result: Result, load_seconds: float, peak: int, total: float) -> dict[str, Any]:
    """The engine's result with what only a run knows: the model, its backend, the settings, load and wall time."""
    data = result.to_dict()
    return {
        "text": data.pop("text"),
        "model": run_plan.model.name,
        "model_path": run_plan.endpoints[0].url if run_plan.endpoints else str(run_plan.model.path),
        "backend": run_plan.backend,
        "backend_reason": run_plan.backend_reason,
        "params": {name: value for name, value, _ in run_plan.settings() if name not in ("model", "backend")},
        **data,
        "timings": {"load_s": round(load_seconds, 4), **data["timings"], "total_s": round(total, 4)},
        "peak_memory_bytes": peak,
    }


def _draft_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """Speculative decoding's line in --stats: how much was drafted and kept (when it was on)."""
    if report["params"].get("draft", "off") == "off":
        return []
    n = report["tokens"]
    if not n["drafted"]:
        return [("drafted", "nothing (no draft found)")]
    share = n["accepted"] / n["drafted"]
    return [("drafted", f"{n['drafted']} tokens, {n['accepted']} accepted ({share:.0%})")]


def _image_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The images' line in --stats: the tokens they took and the time encoding them."""
    n = report["tokens"]
    if not n.get("images"):
        return []
    reused = f", {n['images_reused']} reused" if n["images_reused"] else ""
    return [("images", f"{n['images']} tokens, encoded in {report['timings']['image_encode_s']:.3f} s{reused}")]


def _print_stats(report: dict[str, Any]) -> None:
    from llmrun.cli import render
    from llmrun.units import format_bytes

    t = report["timings"]
    n = report["tokens"]
    stop = report["stop_reason"] + (f" ({report['stop_string']!r})" if report["stop_string"] else "")
    remote = report["backend"] == "remote"
    prompt = f"{n['prompt']} tokens, {t['prompt_tokens_per_s']:.1f} tok/s"
    if n["cached"]:  # from the KV cache (this process's, or the store on disk): not evaluated
        evaluated = n["prompt"] - n["cached"]
        prompt = f"{n['prompt']} tokens, {n['cached']} from the KV cache, {evaluated} evaluated"
    if remote and not n["prompt"]:  # a stream without usage (llama-cpp-python's server)
        prompt = "not reported by the endpoint"
    rows = [
        ("backend", f"{report['backend']} ({report['backend_reason']})"),
        ("connect" if remote else "load", f"{t['load_s']:.2f} s"),
        ("time to first token", f"{t['time_to_first_token_s']:.3f} s"),
        ("prompt", prompt),
        ("generated", f"{n['generated']} tokens, {t['generation_tokens_per_s']:.1f} tok/s"),
        ("stop reason", stop),
        ("seed", "greedy" if report["seed"] is None else report["seed"]),
        *_draft_rows(report),
        *_image_rows(report),
        ("peak memory", format_bytes(report["peak_memory_bytes"])),
    ]
    render.table("", ["stat", "value"], rows, header=False)
