"""Options shared by commands, as ``Annotated`` aliases.

Sampling options default to ``None`` ("not given") so that a value set in
models.toml is not overridden by a built-in default; the defaults shown in the
help come from :data:`llmrun.decoding.sampling.DEFAULTS`, their only home.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmrun.api.flags import FLAGS
from llmrun.backends import attention
from llmrun.cli import complete
from llmrun.decoding.sampling import DEFAULTS, SamplingParams
from llmrun.decoding.speculative import DEFAULT_DRAFT_TOKENS, Draft
from llmrun.errors import UsageError

if TYPE_CHECKING:
    from llmrun.structured import Format

SAMPLING = "Sampling"
LOADING = "Model and context"
OUTPUT = "Output"

FLAG_FOR_FIELD = FLAGS
KV_BITS_TYPES = {4: "q4_0", 8: "q8_0", 16: "f16"}


SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


def sampling_values(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling options a command was given, by field name (None: not given).

    Commands pass ``locals()``: their parameters are named after the fields.
    """
    values = {name: arguments[name] for name in SAMPLING_FIELDS if name in arguments}
    if "stop" in values:
        values["stop"] = values["stop"] or None  # an empty --stop list means "not given"
    return values


def _default(name: str) -> str:
    return f"Default: {getattr(DEFAULTS, name)}."


ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        autocompletion=complete.model_names,
        help="An alias from models.toml or a path to a .gguf file. "
        "Default: $LLMRUN_MODEL, else the default in models.toml (gemma3:270m).",
        rich_help_panel=LOADING,
        show_default=False,
    ),
]
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        "-t",
        help=f"Randomness; 0 = greedy. {_default('temperature')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
TopKOpt = Annotated[
    int | None,
    typer.Option(
        "--top-k",
        help=f"Keep the k most likely tokens; 0 = off. {_default('top_k')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
TopPOpt = Annotated[
    float | None,
    typer.Option(
        "--top-p",
        help=f"Nucleus: smallest set with this much probability; 1 = off. {_default('top_p')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
MinPOpt = Annotated[
    float | None,
    typer.Option(
        "--min-p",
        help=f"Drop tokens below min-p × the top one's probability. {_default('min_p')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
RepeatPenaltyOpt = Annotated[
    float | None,
    typer.Option(
        "--repeat-penalty",
        help=f"Penalise recently seen tokens; 1 = off. {_default('repeat_penalty')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
RepeatLastNOpt = Annotated[
    int | None,
    typer.Option(
        "--repeat-last-n",
        help=f"Tokens the penalties look back at; -1 = all, 0 = off. {_default('repeat_last_n')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
PresencePenaltyOpt = Annotated[
    float | None,
    typer.Option(
        "--presence-penalty",
        help=f"Subtract from tokens already seen. {_default('presence_penalty')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
FrequencyPenaltyOpt = Annotated[
    float | None,
    typer.Option(
        "--frequency-penalty",
        help=f"Subtract × count of each seen token. {_default('frequency_penalty')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        "--seed",
        help="Random seed for reproducible sampling. Default: a fresh one, shown by --stats.",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        "-n",
        help=f"Most tokens to generate; -1 = until done or the context is full. {_default('max_tokens')}",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
StopOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--stop",
        help="Stop when the output contains this text (repeatable).",
        rich_help_panel=SAMPLING,
        show_default=False,
    ),
]
CtxOpt = Annotated[
    int | None,
    typer.Option(
        "--ctx",
        "-c",
        help="Context length in tokens. Default: the model's trained length, at most 4096.",
        rich_help_panel=LOADING,
        show_default=False,
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads", help="CPU threads. Default: physical cores.", rich_help_panel=LOADING, show_default=False
    ),
]
GpuLayersOpt = Annotated[
    int | None,
    typer.Option(
        "--gpu-layers",
        help="Layers to offload to the GPU; -1 = all. Default: all when llama.cpp has GPU offload, else 0.",
        rich_help_panel=LOADING,
        show_default=False,
    ),
]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        autocompletion=complete.backend_names,
        help="auto, gguf (llama.cpp) or mlx. auto: MLX on Apple silicon when the model has an MLX form, "
        "an MLX directory on MLX, everything else on llama.cpp.",
        rich_help_panel=LOADING,
    ),
]
KvBitsOpt = Annotated[
    int | None,
    typer.Option(
        "--kv-bits",
        help="Quantize the KV cache to 4 or 8 bits (GGUF: q4_0/q8_0 K and V; MLX: a quantized cache). Default: 16.",
        rich_help_panel=LOADING,
        show_default=False,
    ),
]
FlashAttnOpt = Annotated[
    str | None,
    typer.Option(
        "--flash-attn",
        autocompletion=complete.choices(*attention.CHOICES),
        help="llama.cpp's flash-attention kernel: on, off, or auto (llmrun's choice for the model: off on a CPU "
        "for heads 64 wide or narrower, where it is slower, else on). Default: auto.",
        rich_help_panel=LOADING,
        show_default=False,
    ),
]
MaxKvSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--max-kv-size",
        help="MLX: a rotating KV cache of N tokens (the first 4 stay, the oldest are overwritten).",
        rich_help_panel=LOADING,
        show_default=False,
    ),
]


def load_values(
    ctx: int | None,
    threads: int | None,
    gpu_layers: int | None,
    kv_bits: int | None = None,
    max_kv_size: int | None = None,
    rpc: list[str] | None = None,
    rpc_allow_remote: bool = False,
    flash_attn: str | None = None,
    show_special: bool = False,
) -> dict[str, Any]:
    """The load options a command was given, by :class:`LoadParams` field (None: not given)."""
    if flash_attn is not None and flash_attn.lower() not in attention.CHOICES:
        raise UsageError(f"--flash-attn must be on, off or auto, got {flash_attn!r}", "auto is llmrun's choice")
    if rpc_allow_remote and not rpc:
        raise UsageError("--rpc-allow-remote needs --rpc", "name the workers: --rpc HOST:PORT,HOST:PORT")
    if kv_bits is not None and kv_bits not in KV_BITS_TYPES:
        raise UsageError(f"--kv-bits must be 4, 8 or 16, got {kv_bits}", "4 and 8 quantize the KV cache; 16 does not")
    return {
        "n_ctx": ctx,
        "n_threads": threads,
        "n_gpu_layers": gpu_layers,
        "kv_type": KV_BITS_TYPES[kv_bits] if kv_bits is not None else None,
        "max_kv_size": max_kv_size,
        "rpc": _workers(rpc, rpc_allow_remote) if rpc else None,
        "flash_attn": attention.CHOICES[flash_attn.lower()] if flash_attn is not None else None,
        "show_special": True if show_special else None,
    }


SPECULATION = "Speculative decoding"
DraftOpt = Annotated[
    str | None,
    typer.Option(
        "--draft",
        help="Draft tokens for the model to check several at a time: ngram (copy from the prompt and the text "
        "so far: quotes, edits, RAG answers), auto (ngram, paused while its drafts are refused), "
        "a small model with the same vocabulary (a name or a file), or off. Sampled output keeps the model's "
        "distribution; a greedy answer matches the plain one except at near-ties (top two tokens within about 0.1 "
        "in log-probability), where llama.cpp's multi-token batches can round the other way. "
        "Default: the model's models.toml `draft`, else off.",
        rich_help_panel=SPECULATION,
        show_default=False,
    ),
]
DraftTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--draft-tokens",
        help=f"With --draft: at most K tokens drafted a step. Default: {DEFAULT_DRAFT_TOKENS}.",
        rich_help_panel=SPECULATION,
        show_default=False,
    ),
]


def draft_choice(draft: str | None, draft_tokens: int | None) -> Draft | None:
    """``--draft`` and ``--draft-tokens`` (None: not given, the model's own setting applies)."""
    if draft is None:
        if draft_tokens is not None:
            raise UsageError("--draft-tokens goes with --draft", "add --draft ngram (or auto, or a draft model)")
        return None
    return Draft.parse(draft, draft_tokens)


KvCacheSizeOpt = Annotated[
    str | None,
    typer.Option(
        "--kv-cache-size",
        help="The KV store on disk: a prompt that starts like an earlier one (the same document, system "
        "prompt or conversation) skips that part's prefill. Its size for every model, least recently used "
        "going first (`llmrun cache ls`). Default: $LLMRUN_KV_CACHE_SIZE, else 4G; 0 = off.",
        rich_help_panel=LOADING,
        show_default=False,
    ),
]
NoKvCacheOpt = Annotated[
    bool,
    typer.Option("--no-kv-cache", help="Neither read nor keep KV cells on disk.", rich_help_panel=LOADING),
]


def kv_cache_choice(size: str | None, off: bool) -> tuple[int | None, str]:
    """The KV store's limit in bytes (None: off) and where it came from."""
    import os

    from llmrun.models.kv_store import DEFAULT_LIMIT
    from llmrun.units import parse_size

    if off:
        if size is not None:
            raise UsageError("--no-kv-cache and --kv-cache-size say different things", "give one of them")
        return None, "command line"
    if size is not None:
        try:
            return parse_size(size) or None, "command line"
        except UsageError as exc:
            raise UsageError(f"--kv-cache-size: {exc.message}", exc.hint) from None
    env = os.environ.get("LLMRUN_KV_CACHE_SIZE")
    if env:
        try:
            return parse_size(env) or None, "LLMRUN_KV_CACHE_SIZE"
        except UsageError as exc:
            raise UsageError(f"LLMRUN_KV_CACHE_SIZE: {exc.message}", exc.hint) from None
    return DEFAULT_LIMIT, "default"


ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Load even when the memory plan says the model will not fit.", rich_help_panel=LOADING
    ),
]
SystemOpt = Annotated[
    str | None,
    typer.Option("--system", "-s", help="System prompt.", rich_help_panel=SAMPLING, show_default=False),
]
RawOpt = Annotated[
    bool,
    typer.Option("--raw", help="Plain completion: do not apply the model's chat template.", rich_help_panel=SAMPLING),
]
TEMPLATES = "Chat template and reasoning"
TemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--template",
        help="Chat template: a Jinja file, or built in: gemma, chatml, llama3, mistral, phi3, raw. "
        "Default: the model's own, else one for its architecture.",
        rich_help_panel=TEMPLATES,
        show_default=False,
    ),
]
ThinkOpt = Annotated[
    bool | None,
    typer.Option(
        "--think/--no-think",
        help="Reasoning models: let the model reason first, or not (the template's enable_thinking). "
        "Default: the template's.",
        rich_help_panel=TEMPLATES,
        show_default=False,
    ),
]
HideThinkingOpt = Annotated[
    bool,
    typer.Option(
        "--hide-thinking",
        help="Reasoning models: do not show the reasoning, only the answer.",
        rich_help_panel=TEMPLATES,
    ),
]


def template_choice(value: str | None) -> tuple[str, str] | None:
    """``--template``: the template and where it came from (None: the model's own)."""
    from llmrun.prompt.template import load_template

    return load_template(value) if value is not None else None


StatsOpt = Annotated[
    bool,
    typer.Option(
        "--stats",
        help="After the answer, print timings, token counts and peak memory (stderr).",
        rich_help_panel=OUTPUT,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON object (text, params, counts, timings) instead of streaming.",
        rich_help_panel=OUTPUT,
    ),
]
ShowParamsOpt = Annotated[
    bool,
    typer.Option(
        "--show-params", help="Print every effective setting and where it came from (stderr).", rich_help_panel=OUTPUT
    ),
]

ShowSpecialOpt = Annotated[
    bool,
    typer.Option(
        "--show-special",
        help="Keep control and markup tokens (<end_of_turn>, <start_of_image>, …) in the answer's text, as "
        "llama.cpp's --special does. Default: left out, as transformers and MLX leave them out.",
        rich_help_panel=OUTPUT,
    ),
]

STRUCTURED = "Structured output"

FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="json: the answer is one JSON value, enforced token by token (see also --schema).",
        show_default=False,
        rich_help_panel=STRUCTURED,
    ),
]
SchemaOpt = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="A JSON Schema (a file, or the JSON itself) the answer must match; enforced while decoding.",
        show_default=False,
        rich_help_panel=STRUCTURED,
    ),
]
GrammarOpt = Annotated[
    Path | None,
    typer.Option(
        "--grammar",
        help="A grammar file the answer must follow: Lark (.lark, llguidance's dialect) or GBNF (.gbnf, llama.cpp's).",
        show_default=False,
        rich_help_panel=STRUCTURED,
    ),
]


def response_format(fmt: str | None, schema: str | None, grammar: Path | None) -> Format | None:
    """The format --format, --schema or --grammar asks for (at most one of them)."""
    from llmrun.structured import ANY_JSON, load_grammar, load_schema

    given = [flag for flag, value in (("--format", fmt), ("--schema", schema), ("--grammar", grammar)) if value]
    if len(given) > 1:
        raise UsageError(f"{given[0]} and {given[1]} both set the answer's format", "give one of them")
    if fmt is not None and fmt.strip().lower() != "json":
        raise UsageError(
            f"--format must be json, got {fmt!r}", "use --schema for a JSON Schema, --grammar for a grammar"
        )
    if fmt:
        return ANY_JSON
    if schema:
        return load_schema(schema)
    if grammar:
        return load_grammar(grammar)
    return None


RETRIEVAL = "Retrieval (RAG)"

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="Vector store: postgresql://USER@HOST/DB (pgvector), qdrant://HOST:6333, qdrant+https://HOST, "
        "qdrant+local:///DIR (default: the embedded store under the data directory; also LLMRUN_VECTOR_STORE).",
        show_default=False,
        rich_help_panel=RETRIEVAL,
    ),
]
TopChunksOpt = Annotated[
    int,
    typer.Option("-k", "--chunks", min=1, max=100, help="How many chunks to retrieve.", rich_help_panel=RETRIEVAL),
]
RagOpt = Annotated[
    str | None,
    typer.Option(
        "--rag",
        help="Answer from this document collection (made by llmrun index add DOCS -c NAME); the sources follow.",
        show_default=False,
        rich_help_panel=RETRIEVAL,
    ),
]
MinScoreOpt = Annotated[
    float,
    typer.Option(
        "--min-score",
        min=-1.0,
        max=1.0,
        help="Leave out chunks less similar than this (cosine, -1 to 1; what counts as relevant depends on "
        "the embedding model: about 0.3-0.4 for all-MiniLM).",
        rich_help_panel=RETRIEVAL,
    ),
]

IMAGES = "Images"
ImageOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--image",
        "-i",
        help="An image the model reads before the prompt (PNG, JPEG, GIF or BMP; '-': stdin's bytes; "
        "repeatable). The model needs its projector: --mmproj.",
        rich_help_panel=IMAGES,
        show_default=False,
    ),
]
MmprojOpt = Annotated[
    Path | None,
    typer.Option(
        "--mmproj",
        help="A vision model's projector file (its mmproj GGUF), which turns images into what the model reads.",
        rich_help_panel=IMAGES,
        show_default=False,
    ),
]
ImageMaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--image-max-tokens",
        min=1,
        help="The most tokens an image may take (projectors with a variable resolution downscale to fit).",
        rich_help_panel=IMAGES,
        show_default=False,
    ),
]

REMOTE = "Remote engines"
EndpointOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--endpoint",
        help="Run on an OpenAI-compatible engine (vLLM, llama-server, Ollama, llmrun serve, …) at this URL, "
        "e.g. http://gpu1:8000/v1 (repeatable: a fleet). -m then names the model as it serves it "
        "(default: its only model); its key comes from LLMRUN_API_KEY.",
        rich_help_panel=REMOTE,
        show_default=False,
    ),
]
RpcOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--rpc",
        help="Put the model's layers on llama.cpp RPC workers (ggml-rpc-server) at HOST:PORT[,HOST:PORT…], "
        "split by their free memory. The protocol has no authentication: keep workers on a private network.",
        rich_help_panel=REMOTE,
        show_default=False,
    ),
]
RpcAllowRemoteOpt = Annotated[
    bool,
    typer.Option(
        "--rpc-allow-remote",
        help="Allow --rpc workers that are not on this machine (they trust anyone who can connect).",
        rich_help_panel=REMOTE,
    ),
]


def _workers(values: list[str], allow_remote: bool) -> tuple[str, ...]:
    from llmrun.backends.rpc import parse_workers  # sockets: only when there are workers

    return parse_workers(values, allow_remote=allow_remote)
