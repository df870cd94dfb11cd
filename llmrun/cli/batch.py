"""``llmrun batch``: many prompts, decoded together."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from llmrun.cli import options as o
from llmrun.errors import InsufficientMemory, InvalidParameter, UsageError

if TYPE_CHECKING:
    from llmrun.backends.base import BatchRequest, Done, LoadedModel
    from llmrun.batchio import Item, OrderedWriter
    from llmrun.pipeline import RunPlan


def batch(
    source: Annotated[str, typer.Argument(metavar="INPUT", help="Prompts: a text file (one per line), JSONL, or '-'.")],
    model: o.ModelOpt = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="JSONL results file. Default: stdout.", show_default=False)
    ] = None,
    parallel: Annotated[int, typer.Option("--parallel", "-P", min=1, max=64, help="Sequences decoded together.")] = 8,
    resume: Annotated[bool, typer.Option("--resume", help="Skip ids already in --output and append the rest.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Stop at the first malformed input line.")] = False,
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
    ctx: Annotated[
        int | None,
        typer.Option(
            "--ctx",
            "-c",
            help="Context per sequence. Default: 2048 (at most the trained length).",
            rich_help_panel=o.LOADING,
            show_default=False,
        ),
    ] = None,
    threads: o.ThreadsOpt = None,
    force: o.ForceOpt = False,
) -> None:
    """Generate answers for many prompts with continuous batching; results as JSONL in input order.

    Per-line "max_tokens", "temperature" and "seed" in JSONL override the flags.

    Example: llmrun batch prompts.txt -o answers.jsonl --parallel 8 -n 64
    """
    from llmrun import batchio
    from llmrun.cli import render
    from llmrun.cli.run import plan

    lines = _read(source)
    items, problems = [], []
    for parsed in batchio.parse(lines):
        if isinstance(parsed, batchio.LineError):
            if strict:
                raise UsageError(
                    f"{source}:{parsed.line}: {parsed.message}", "fix the line, or drop --strict to skip it"
                )
            problems.append(parsed)
        else:
            items.append(parsed)
    for problem in problems:
        render.warn(f"{source}:{problem.line}: {problem.message}; skipped")
    if not items:
        raise UsageError(f"{source} has no prompts", 'one prompt per line, or JSONL lines with "prompt" or "messages"')
    done_ids: set[str] = set()
    if output is not None and output.exists() and output.stat().st_size:
        if not resume:
            raise UsageError(f"{output} already exists", "pass --resume to continue it, or choose another --output")
        done_ids = batchio.finished_ids(output)
    todo = [item for item in items if item.id not in done_ids]
    if done_ids:
        render.note(f"resuming: {len(items) - len(todo)} of {len(items)} already in {output}")
    flags = o.sampling_values(locals())
    run_plan = plan(model, flags, {"n_ctx": ctx or 2048, "n_threads": threads, "n_gpu_layers": None}, force)
    if run_plan.backend == "mlx" and parallel > 1:
        render.note("the MLX backend answers batch prompts one after another (--parallel 1)")
        parallel = 1
    _check_memory(run_plan, parallel, force)
    if not todo:
        return
    handle: IO[str] = output.open("a", encoding="utf-8") if output is not None else sys.stdout
    try:
        _run(run_plan, todo, parallel, system, raw, handle)
    finally:
        if output is not None:
            handle.close()


def _read(source: str) -> list[str]:
    if source == "-":
        return sys.stdin.readlines() if sys.stdin is not None else []
    path = Path(source).expanduser()
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist", "check the path, or pass - to read stdin") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory", "pass a text or JSONL file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text", "save it as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}", "check its permissions") from None


def _check_memory(run_plan: RunPlan, parallel: int, force: bool) -> None:
    from llmrun.cli import render
    from llmrun.memory import format_bytes, plan
    from llmrun.sysinfo import available_memory

    total = plan(run_plan.header, run_plan.load.n_ctx * parallel, run_plan.load.kv_type).total_bytes
    available = available_memory()
    if total > available:
        message = (
            f"{parallel} sequences of {run_plan.load.n_ctx} tokens need about {format_bytes(total)} "
            f"but {format_bytes(available)} is available"
        )
        if not force:
            raise InsufficientMemory(message, "lower --parallel or --ctx, or pass --force")
        render.warn(message + "; going ahead (--force)")


def _run(run_plan: RunPlan, items: list[Item], parallel: int, system: str | None, raw: bool, handle: IO[str]) -> None:
    from llmrun import batchio
    from llmrun.backends.base import BatchRequest
    from llmrun.cli import render
    from llmrun.cli.chat import choose_template
    from llmrun.pipeline import chat_template, conversation_ids, load, prompt_ids
    from llmrun.template import Message

    with render.status(f"Loading {run_plan.model.name}…"):
        model = load(run_plan)
    try:
        template = chat_template(run_plan)
        conversation_template = choose_template(None, run_plan)[1]
        requests, by_index = [], {}
        writer = batchio.OrderedWriter(handle, [item.id for item in items])
        for index, item in enumerate(items):
            try:
                params = dataclasses.replace(run_plan.sampling, **item.overrides)
            except (InvalidParameter, TypeError) as exc:
                render.warn(f"line {item.line} (id {item.id}): {getattr(exc, 'message', exc)}; skipped")
                writer.add(item.id, None)
                continue
            if item.prompt is not None:
                ids, _ = prompt_ids(model, template, item.prompt, system, raw)
            else:
                head = [Message("system", system)] if system else []
                ids = conversation_ids(model, conversation_template, head + [Message(r, c) for r, c in item.messages])
            requests.append(BatchRequest(index, ids, params))
            by_index[index] = item
        _generate(model, requests, by_index, parallel, run_plan.load.n_ctx, writer)
    finally:
        model.close()


def _generate(
    model: LoadedModel,
    requests: list[BatchRequest],
    by_index: dict[int, Item],
    parallel: int,
    n_ctx: int,
    writer: OrderedWriter,
) -> None:
    from llmrun.cli import render

    started = time.perf_counter()
    tokens = failed = done = 0
    outcomes = model.generate_batch(requests, parallel, n_ctx)
    # closed before the model is: the batch context must go first, even on Ctrl-C
    with render.batch_progress(len(requests)) as progress, contextlib.closing(outcomes):
        for outcome in outcomes:
            item = by_index[outcome.index]
            if outcome.done is None:
                failed += 1
                render.warn(f"line {item.line} (id {item.id}): {outcome.error}; skipped")
                writer.add(item.id, None)
            else:
                stats = outcome.done.stats
                tokens += stats.generated_tokens
                writer.add(item.id, _record(item, outcome.done))
            done += 1
            progress(done, tokens / (time.perf_counter() - started))
    elapsed = time.perf_counter() - started
    render.note(
        f"{done - failed} of {len(requests)} prompts answered, {tokens} tokens in {elapsed:.1f} s "
        f"({tokens / elapsed:.1f} tok/s, {parallel} in parallel)" + (f", {failed} failed" if failed else "")
    )


def _record(item: Item, done: Done) -> dict[str, Any]:
    s = done.stats
    return {
        "id": item.output_id,
        "text": done.text,
        "tokens": {"prompt": s.prompt_tokens, "generated": s.generated_tokens},
        "stop_reason": s.finish_reason,
        "seed": s.seed,
        "timings": {
            "time_to_first_token_s": round(s.prompt_seconds, 4),
            "generation_tokens_per_s": round(s.generation_tps, 2),
        },
    }
