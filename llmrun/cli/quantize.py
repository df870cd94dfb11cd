"""``llmrun quantize`` and ``llmrun eval``: make a smaller model, and measure what it cost."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmrun.cli import options as o
from llmrun.errors import LlmrunError, UsageError

if TYPE_CHECKING:
    from llmrun.quantize.evaluate import QualityReport, Side

TokensOpt = Annotated[
    int | None,
    typer.Option(
        "--tokens",
        help="Evaluate only the first N tokens of the text. Default: all of it (~2,300 tokens built in).",
        show_default=False,
    ),
]
TextOpt = Annotated[
    Path | None,
    typer.Option("--text", help="Evaluate on this UTF-8 text file instead of the built-in text.", show_default=False),
]


def quantize(
    source: Annotated[
        str,
        typer.Argument(
            help="A GGUF (file, model name, owner/repo) or a Hugging Face safetensors directory (./dir).",
            show_default=False,
        ),
    ],
    bits: Annotated[
        int | None, typer.Option("--bits", help="4 or 8. GGUF: 4 = Q4_K_M, 8 = Q8_0. Default: 4.", show_default=False)
    ] = None,
    qtype: Annotated[
        str | None,
        typer.Option("--type", help="GGUF type: Q4_K_M, Q4_0, Q5_K_M, Q6_K, Q8_0, …", show_default=False),
    ] = None,
    fmt: Annotated[
        str | None,
        typer.Option("--format", help="gguf or mlx. Default: as the source (dir: mlx).", show_default=False),
    ] = None,
    group_size: Annotated[
        int | None, typer.Option("--group-size", help="MLX group size: 32, 64 or 128. Default: 64.", show_default=False)
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where to write. Default: in the local store.", show_default=False),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="Store name to run it by. Default: source name + quant tag.", show_default=False),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output and store name.")] = False,
    allow_requantize: Annotated[
        bool, typer.Option("--allow-requantize", help="Quantize an already quantized GGUF (loses more quality).")
    ] = False,
    imatrix: Annotated[
        Path | None,
        typer.Option("--imatrix", help="An importance matrix from llama-imatrix (.gguf or .dat).", show_default=False),
    ] = None,
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the quality report.")] = False,
    tokens: TokensOpt = None,
    text: TextOpt = None,
    threads: o.ThreadsOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result and report as JSON.")] = False,
) -> None:
    """Quantize a model to 4 or 8 bits (GGUF through llama.cpp, MLX through mlx-lm), register it,
    and report what it cost in quality against the source.

    Examples:
      llmrun convert gemma3:270m --to gguf --type f16 -o gemma-f16.gguf
      llmrun quantize ./gemma-f16.gguf --type Q8_0
      llmrun quantize ./gemma-mlx-16bit --bits 4
    """
    from llmrun.cli import bars, render
    from llmrun.formats.output import tree_size
    from llmrun.models.registry import load_registry
    from llmrun.quantize import job
    from llmrun.quantize.evaluate import describe
    from llmrun.units import format_bytes

    _check_tokens(tokens)
    eval_text = _read_text(text) if not no_eval else None
    request = job.Request(
        source, bits, qtype, fmt, group_size, output, name, force, allow_requantize, imatrix, threads or 0
    )
    report, report_error = None, None
    with bars.work_progress() as progress, job.quantize(request, load_registry(), progress) as outcome:
        for line in outcome.notes:
            render.note(line)
        size = tree_size(outcome.path)
        render.note(f"wrote {outcome.path} ({outcome.type}, {format_bytes(size)}) in {outcome.seconds:.1f} s")
        render.note(f'registered as {outcome.name}: llmrun run -m {outcome.name} "Hello"')
        if eval_text is not None:
            reference = describe(outcome.source.name, outcome.reference)
            candidate = describe(outcome.name, outcome.path)
            try:  # the model is written and registered: a report that cannot be made is a warning
                report = _measure(reference, candidate, eval_text, tokens, threads, progress)
            except LlmrunError as exc:
                report_error = exc.message
                render.warn(f"no quality report: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
    result: dict[str, Any] = {
        "name": outcome.name,
        "path": str(outcome.path),
        "format": outcome.format,
        "type": outcome.type,
        "source": outcome.source.name,
        "seconds": round(outcome.seconds, 2),
    }
    if json_output:
        render.print_json({**result, "report": report.to_dict() if report else None, "report_error": report_error})
    elif report is not None:
        quality_table(report)


def evaluate(
    model: Annotated[str, typer.Argument(help="The model to measure (a name, a .gguf, an MLX directory).")],
    ref: Annotated[
        str | None,
        typer.Option("--ref", help="Reference model. Default: the source it was quantized from.", show_default=False),
    ] = None,
    tokens: TokensOpt = None,
    text: TextOpt = None,
    threads: o.ThreadsOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Measure a model against a reference on a fixed text: perplexity of each, mean KL divergence
    of their next-token distributions, top-1 agreement, and sizes.

    Example: llmrun eval gemma3-270m-q4_k_m --ref ./gemma-f16.gguf
    """
    from llmrun.cli import bars, render
    from llmrun.models.registry import load_registry
    from llmrun.models.resolve import resolve
    from llmrun.quantize.evaluate import describe

    _check_tokens(tokens)
    eval_text = _read_text(text)
    registry = load_registry()
    from llmrun.models.refs import ModelRef

    with bars.download_progress() as progress:
        candidate = resolve(ModelRef.parse(model), registry, progress, _backend_of(model))
        if ref is None:
            reference_path = _recorded_source(candidate.name)
            reference_name = str(reference_path)
        else:
            resolved = resolve(ModelRef.parse(ref), registry, progress, _backend_of(ref))
            reference_path, reference_name = resolved.path, resolved.name
    with bars.work_progress() as work:
        report = _measure(
            describe(reference_name, reference_path), describe(candidate.name, candidate.path),
            eval_text, tokens, threads, work,
        )  # fmt: skip
    if json_output:
        render.print_json(report.to_dict())
    else:
        quality_table(report)


def _backend_of(name: str) -> str:
    return "mlx" if Path(name).expanduser().is_dir() else "gguf"


def _recorded_source(name: str) -> Path:
    from llmrun.models.store import read_index

    entry = read_index().get(name)
    source = entry.get("source_path") if entry else None
    if not source:
        raise UsageError(f"{name} has no recorded source to compare with", "pass the reference: --ref MODEL")
    path = Path(source)
    if not path.exists():
        raise UsageError(f"{name}'s source {path} is gone", "pass the reference: --ref MODEL")
    return path


def _check_tokens(tokens: int | None) -> None:
    if tokens is not None and tokens < 2:
        raise UsageError(f"--tokens must be at least 2, got {tokens}", "")


def _read_text(path: Path | None) -> tuple[str, str]:
    """(text, how to name it): the file's, else the built-in evaluation text."""
    if path is None:
        from llmrun.quantize.texts import eval_text

        return eval_text(), "built-in"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--text {path} does not exist", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --text {path}: {exc}", "pass a UTF-8 text file") from None
    if not text.strip():
        raise UsageError(f"--text {path} is empty", "pass a text of at least a few hundred words")
    return text, str(path)


def _measure(
    reference: Side, candidate: Side, text: tuple[str, str], tokens: int | None, threads: int | None, progress: Any
) -> QualityReport:
    from llmrun.quantize.evaluate import evaluate
    from llmrun.sysinfo import available_memory, default_threads

    content, text_name = text
    return evaluate(
        reference,
        candidate,
        content,
        text_name=text_name,
        max_tokens=tokens,
        threads=threads or default_threads(),
        progress=progress,
        available_memory=available_memory(),
    )


def quality_table(report: QualityReport) -> None:
    """The report as the command's answer (stdout)."""
    from llmrun.cli import render
    from llmrun.units import format_bytes

    ref, cand, c = report.reference, report.candidate, report.comparison
    rows = [
        ("model", ref.name, cand.name),
        ("type", ref.type, cand.type),
        ("size", format_bytes(ref.size_bytes), f"{format_bytes(cand.size_bytes)} ({report.size_ratio:.2f}×)"),
        ("perplexity", f"{c.perplexity_reference:.3f}", f"{c.perplexity_candidate:.3f} "
         f"({(c.perplexity_candidate / c.perplexity_reference - 1) * 100:+.2f}%)"),
        ("mean KL divergence", "", f"{c.mean_kl:.5f}"),
        ("top-1 agreement", "", f"{c.top1_agreement * 100:.1f}%"),
    ]  # fmt: skip
    title = f"Quality: {c.positions:,} positions of the {report.text} text ({report.seconds:.0f} s)"
    render.table(title, ["", "reference", "quantized"], rows, stdout=True)
