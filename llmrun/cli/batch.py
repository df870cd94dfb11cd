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
from llmrun.errors import InvalidParameter, UsageError, word

if TYPE_CHECKING:
    from llmrun.api.batch import Item, OrderedWriter
    from llmrun.decoding.speculative import Draft
    from llmrun.engine.core import Engine, LoadedEntry
    from llmrun.engine.plan import RunPlan
    from llmrun.engine.request import Request
    from llmrun.engine.result import Result
    from llmrun.structured import Format

BATCH_CONTEXT = 2048  # per sequence, unless --ctx (at most the model's trained length)
LOCAL_PARALLEL = 8
DEFAULT_SLOTS = 4  # llmrun.remote.fleet.DEFAULT_SLOTS (not imported: the CLI starts without httpx)


def batch(
    source: Annotated[str, typer.Argument(metavar="INPUT", help="Prompts: a text file (one per line), JSONL, or '-'.")],
    model: o.ModelOpt = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="JSONL results file. Default: stdout.", show_default=False)
    ] = None,
    parallel: Annotated[
        int | None,
        typer.Option(
            "--parallel",
            "-P",
            min=1,
            max=64,
            help=f"Sequences decoded together (default {LOCAL_PARALLEL}); with --endpoint, requests in flight per "
            f"endpoint (default: the slots it reports, else {DEFAULT_SLOTS}).",
            show_default=False,
        ),
    ] = None,
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
    template: o.TemplateOpt = None,
    think: o.ThinkOpt = None,
    ctx: Annotated[
        int | None,
        typer.Option(
            "--ctx",
            "-c",
            help=f"Context per sequence. Default: {BATCH_CONTEXT} (at most the trained length).",
            rich_help_panel=o.LOADING,
            show_default=False,
        ),
    ] = None,
    threads: o.ThreadsOpt = None,
    flash_attn: o.FlashAttnOpt = None,
    draft: o.DraftOpt = None,
    draft_tokens: o.DraftTokensOpt = None,
    kv_cache_size: o.KvCacheSizeOpt = None,
    no_kv_cache: o.NoKvCacheOpt = False,
    force: o.ForceOpt = False,
    answer_format: o.FormatOpt = None,
    schema: o.SchemaOpt = None,
    grammar: o.GrammarOpt = None,
    endpoint: o.EndpointOpt = None,
    rpc: o.RpcOpt = None,
    rpc_allow_remote: o.RpcAllowRemoteOpt = False,
    mmproj: o.MmprojOpt = None,
    image_max_tokens: o.ImageMaxTokensOpt = None,
) -> None:
    """Generate answers for many prompts with continuous batching; results as JSONL in input order.

    Per-line "max_tokens", "temperature" and "seed" in JSONL override the flags, and a line's
    "response_format" (OpenAI's shape) or "schema" (a JSON Schema) its answer's format. OpenAI Batch
    API lines ({"custom_id", "method", "url", "body"}) are answered in its output shape. A line's
    "images" (file paths; with --mmproj) are read before its prompt, one such line at a time.

    Example: llmrun batch prompts.txt -o answers.jsonl --parallel 8 -n 64

    Across a fleet: llmrun batch jobs.jsonl -o out.jsonl --endpoint http://gpu1:8000/v1 --endpoint http://gpu2:8000/v1
    """
    from llmrun.api import batch as batchio
    from llmrun.cli import render
    from llmrun.cli.run import check_format, plan, with_projector

    constrained = o.response_format(answer_format, schema, grammar)
    check_format(constrained)
    chosen = o.template_choice(template)
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
    load_flags = o.load_values(ctx, threads, None, rpc=rpc, rpc_allow_remote=rpc_allow_remote, flash_attn=flash_attn)
    run_plan = plan(
        model,
        flags,
        load_flags,
        force,
        context_cap=BATCH_CONTEXT,
        draft=batch_draft(draft, draft_tokens),
        endpoints=endpoint or (),
        kv_cache=o.kv_cache_choice(kv_cache_size, no_kv_cache),
    )
    run_plan = with_projector(run_plan, (), mmproj, image_max_tokens)
    if run_plan.backend != "remote":
        parallel = parallel or LOCAL_PARALLEL
        if run_plan.backend == "mlx" and parallel > 1:
            render.note("the MLX backend answers batch prompts one after another (--parallel 1)")
            parallel = 1
        _check_memory(run_plan, parallel, force)
    if not todo:
        return
    handle: IO[str] = output.open("a", encoding="utf-8") if output is not None else sys.stdout
    try:
        _run(run_plan, todo, parallel or 0, Shape(system, raw, constrained, chosen, think), handle)
    finally:
        if output is not None:
            handle.close()


def batch_draft(draft: str | None, draft_tokens: int | None) -> Draft | None:
    """``--draft`` for many sequences at once: prompt lookup (a draft model drafts for one sequence)."""
    chosen = o.draft_choice(draft, draft_tokens)
    if chosen is not None and chosen.mode == "model":
        raise UsageError(
            "--draft MODEL drafts for one sequence at a time, and batch decodes many together",
            "use --draft ngram or --draft auto (prompt lookup, per sequence)",
        )
    return chosen


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
    from llmrun.engine.load import check_parallel_memory
    from llmrun.sysinfo import available_memory

    warning = check_parallel_memory(run_plan, parallel, available_memory(), force=force)
    if warning:
        render.warn(warning)


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """What every line's request shares unless the line says otherwise."""

    system: str | None
    raw: bool
    answer_format: Format | None
    template: tuple[str, str] | None = None  # --template: the template and where it came from
    think: bool | None = None


def _run(run_plan: RunPlan, items: list[Item], parallel: int, shape: Shape, handle: IO[str]) -> None:
    from llmrun.api import batch as batchio
    from llmrun.cli import render
    from llmrun.cli.images import read_images
    from llmrun.engine.core import Engine
    from llmrun.engine.request import Request
    from llmrun.errors import LlmrunError
    from llmrun.prompt.template import Message

    writer = batchio.OrderedWriter(handle, [item.id for item in items])
    requests: list[Request] = []
    kept: list[Item] = []
    for item in items:
        if item.openai is not None:
            built = _openai_request(run_plan, item)
            if isinstance(built, str):
                render.warn(f"line {item.line} (custom_id {item.id}): {built}; skipped")
                writer.add(item.id, None)
            else:
                requests.append(built)
                kept.append(item)
            continue
        try:
            params = dataclasses.replace(run_plan.sampling, **item.overrides)
        except (InvalidParameter, TypeError) as exc:
            fields = {name: name for name in item.overrides}  # named as the line names them, not as flags
            render.warn(f"line {item.line} (id {item.id}): {word(str(exc), fields)}; skipped")
            writer.add(item.id, None)
            continue
        fmt = item.response_format or shape.answer_format
        try:
            images = read_images([Path(image).expanduser() for image in item.images], prompt="")
        except LlmrunError as exc:
            render.warn(f"line {item.line} (id {item.id}): {exc.message}; skipped")
            writer.add(item.id, None)
            continue
        if item.prompt is not None:
            request = Request(
                prompt=item.prompt,
                params=params,
                system=shape.system,
                raw=shape.raw,
                response_format=fmt,
                think=shape.think,
                images=images,
            )
        else:
            messages = tuple(Message(role, content) for role, content in item.messages)
            request = Request(
                messages=messages,
                params=params,
                system=shape.system,
                response_format=fmt,
                think=shape.think,
                images=images,
            )
        requests.append(request)
        kept.append(item)
    engine = Engine(template=shape.template)
    with render.status(f"Loading {run_plan.model.name}…"):
        entry = engine.load(run_plan)
    try:
        _generate(engine, entry, requests, kept, parallel, run_plan, writer)
    finally:
        engine.close()


def _openai_request(run_plan: RunPlan, item: Item) -> Request | str:
    """An OpenAI Batch line's request, its body read as ``llmrun serve`` reads one (its ``model`` is the
    job's, not this command's: the model is -m's, as a job moves between engines unchanged); or what is wrong."""
    from llmrun.api import openai as api
    from llmrun.api.errors import ApiError

    assert item.openai is not None
    body = {**item.openai.body, "model": item.openai.body.get("model") or run_plan.model.name}
    parse = api.parse_chat if item.openai.chat else api.parse_completion
    try:
        call = parse(body, run_plan.sampling, api.Limits(max_tokens=run_plan.load.n_ctx))
    except ApiError as exc:
        return str(exc)
    if len(call.requests) != 1:
        return "a batch line asks for one answer (n 1, one prompt)"
    return call.requests[0]


def _record(item: Item, result: Result, model: str) -> dict[str, Any]:
    """A result's output line: llmrun's shape, or the OpenAI Batch API's for its lines."""
    if item.openai is None:
        return {"id": item.output_id, **result.to_dict()}
    import time as clock
    import uuid

    from llmrun.api import batch as batchio
    from llmrun.api import openai as api

    chat = item.openai.chat
    body = {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
        "object": "chat.completion" if chat else "text_completion",
        "created": int(clock.time()),
        "model": model,
        "choices": [(api.chat_choice if chat else api.completion_choice)(0, result, None)],
        "usage": api.usage([result]),
    }
    return batchio.openai_result(item.id, body)


def _generate(
    engine: Engine,
    entry: LoadedEntry,
    requests: list[Request],
    items: list[Item],
    parallel: int,
    run_plan: RunPlan,
    writer: OrderedWriter,
) -> None:
    from llmrun.cli import bars, render
    from llmrun.engine.result import Result

    started = time.perf_counter()
    tokens = failed = done = 0
    results = engine.complete_many(entry, requests, parallel, run_plan.load.n_ctx)
    with bars.batch_progress(len(requests)) as progress, contextlib.closing(results):
        for index, result in results:
            item = items[index]
            if isinstance(result, Result):
                tokens += result.generated_tokens
                writer.add(item.id, _record(item, result, run_plan.model.name))
            else:
                failed += 1
                render.warn(f"line {item.line} (id {item.id}): {result.message}; skipped")
                writer.add(item.id, None)
            done += 1
            progress(done, tokens / (time.perf_counter() - started))
    elapsed = time.perf_counter() - started
    endpoints = len(run_plan.endpoints)
    how = f"over {endpoints} endpoint{'s' if endpoints > 1 else ''}" if endpoints else f"{parallel} in parallel"
    render.note(
        f"{done - failed} of {len(requests)} prompts answered, {tokens} tokens in {elapsed:.1f} s "
        f"({tokens / elapsed:.1f} tok/s, {how})" + (f", {failed} failed" if failed else "")
    )
