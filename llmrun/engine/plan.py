"""Everything between a model name and a running model, as plain functions.

:func:`plan_run` resolves the model, reads its header with the bounded reader,
merges settings from their layers (built-in default, models.toml, command line)
and checks the memory plan; :func:`load` loads it; :func:`prompt_ids` turns the
user's text into tokens (through the chat template when there is one).
No printing here: warnings come back as data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrun.backends import attention
from llmrun.backends.base import LoadParams
from llmrun.decoding.sampling import SamplingParams, merge_layers
from llmrun.decoding.speculative import Draft
from llmrun.engine import select
from llmrun.engine.select import Choice, Platform
from llmrun.errors import InsufficientMemory, LlmrunError, ModelFileError, UsageError
from llmrun.files import Progress
from llmrun.formats.gguf_header import GgufHeader, check_loadable, is_embedding_model, read_header
from llmrun.formats.memory import Geometry, MemoryPlan, default_context, geometry, plan
from llmrun.formats.mlx_header import read_mlx_header
from llmrun.models.endpoint import Endpoint
from llmrun.models.refs import ModelRef
from llmrun.models.registry import Registry, default_model_name
from llmrun.models.resolve import ResolvedModel, resolve
from llmrun.units import format_bytes

COMMAND_LINE = "command line"


@dataclass(frozen=True, slots=True)
class Located:
    model: ResolvedModel
    source: str  # where the model name came from
    header: GgufHeader  # for an MLX directory: its config and safetensors headers, in the same shape
    backend: Choice


def locate(
    registry: Registry,
    model_name: str | None,
    progress: Progress | None = None,
    backend: str = "auto",
    here: Platform | None = None,
) -> Located:
    """Choose the backend, resolve the model (the named one, else the default) in the form that
    backend runs, and read its header, bounded."""
    if model_name:
        name, source = model_name, COMMAND_LINE
    else:
        name, source = default_model_name(registry)
    select.check_requested(backend)  # about the flag, not the model
    entry = registry.get(name)
    if entry is not None and entry.remote:
        raise remote_refusal(name, entry.endpoints)
    try:
        ref = ModelRef.parse(name)
        choice = select.choose_for(backend, name, ref, registry, here)
        resolved = resolve(ref, registry, progress, choice.backend)
        header = read_mlx_header(resolved.path) if choice.backend == "mlx" else _gguf_header(resolved.path)
        return Located(resolved, source, header, choice)
    except LlmrunError as exc:
        if source == COMMAND_LINE:
            raise
        exc.message = f"{exc.message} (the default model, set by {source})"  # a name the user did not type
        exc.args = (exc.message,)
        raise


def remote_refusal(name: str, endpoints: Sequence[str]) -> UsageError:
    """The error for a command that needs the model itself (its files, tokenizer or logits) on a remote model."""
    return UsageError(
        f"{name} runs on a remote engine ({', '.join(endpoints)}), which offers completions only, "
        "not the model's files, tokenizer or logits",
        "use a local model for this command",
    )


def _gguf_header(path: Path) -> GgufHeader:
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory, not a GGUF file", "for an MLX model directory use `backend` mlx")
    from llmrun.formats.header_cache import cached_header

    return cached_header(path, read_header)


@dataclass(frozen=True, slots=True)
class RunPlan:
    model: ResolvedModel
    model_source: str
    backend: str
    backend_reason: str
    header: GgufHeader
    load: LoadParams
    sampling: SamplingParams
    sources: dict[str, str]  # field name -> where its value came from
    memory: MemoryPlan
    warnings: tuple[str, ...]
    draft: Draft = field(default_factory=Draft)  # speculative decoding
    draft_model: ResolvedModel | None = None  # the draft model, located (mode ``model``)
    endpoints: tuple[Endpoint, ...] = ()  # backend ``remote``: where the model is served
    kv_cache: int | None = None  # the KV store's limit in bytes: prefixes kept on disk (None: off)
    mmproj: Path | None = None  # a vision model's projector: the model reads images
    mmproj_source: str = "command line"
    image_max_tokens: int | None = None  # the most positions an image may take (None: the projector's own)

    @property
    def extras(self) -> frozenset[str]:
        """The sampling settings the user set (not defaults): a remote engine gets the non-OpenAI ones."""
        return frozenset(name for name, source in self.sources.items() if source != "default")

    @property
    def system(self) -> str | None:
        """The system prompt the model's store keeps with it (Ollama's SYSTEM), for requests without one."""
        return self.model.foreign.system if self.model.foreign else None

    def settings(self) -> list[tuple[str, Any, str]]:
        """(field, value, source) for every effective setting."""
        rows: list[tuple[str, Any, str]] = [
            ("model", self.model.name, self.model_source),
            ("backend", self.backend, self.backend_reason),
        ]
        if self.backend == "remote":
            rows[0] = ("model", self.model.name, self.model_source)
            rows += [("endpoint", ", ".join(e.url for e in self.endpoints), self.sources["endpoint"])]
            rows += [(name, value, self.sources[name]) for name, value in self.sampling.to_dict().items()]
            return rows
        names = ["n_ctx", "n_threads", "n_gpu_layers", "kv_type"]
        names += ["max_kv_size"] if self.backend == "mlx" else []
        rows += [(name, getattr(self.load, name), self.sources[name]) for name in names]
        if self.backend == "gguf":
            rows.append(("flash_attn", attention.word(self.load.flash_attn), self.sources.get("flash_attn", "default")))
        if self.load.rpc:
            rows.append(("rpc", ",".join(self.load.rpc), self.sources["rpc"]))
        rows += [(name, value, self.sources[name]) for name, value in self.sampling.to_dict().items()]
        source = self.sources.get("draft", "default")
        rows.append(("draft", self.draft.value, source))
        if self.draft.on:
            rows.append(("draft_tokens", self.draft.tokens, source))
        kv_cache = format_bytes(self.kv_cache) if self.kv_cache else "off"
        rows.append(("kv_cache", kv_cache, self.sources.get("kv_cache", "default")))
        if self.mmproj is not None:
            rows.append(("mmproj", str(self.mmproj), self.mmproj_source))
            if self.image_max_tokens is not None:
                rows.append(("image_max_tokens", self.image_max_tokens, "command line"))
        return rows


def plan_run(
    registry: Registry,
    model_name: str | None,
    sampling_flags: Mapping[str, Any],
    load_flags: Mapping[str, Any],
    *,
    force: bool,
    available_memory: Callable[[], int],
    load_defaults: Callable[[], Mapping[str, int]],
    progress: Progress | None = None,
    backend: str = "auto",
    here: Platform | None = None,
    context_cap: int | None = None,
    draft: Draft | None = None,
    endpoints: Sequence[str] = (),
    kv_cache: tuple[int | None, str] = (None, "default"),
) -> RunPlan:
    """Everything a run needs before loading: the model located, its settings merged by layer
    (default, models.toml, command line), and warnings. Without ``n_ctx`` the context is the
    trained length, at most 4096 (or ``context_cap``). ``draft`` (from the command line) turns speculative
    decoding on or off, over the model's models.toml ``draft``. ``endpoints`` (``--endpoint``): the model
    is served there, under the name given (else the endpoint's only model); so is a models.toml entry
    with an ``endpoint``. ``kv_cache``: the KV store's limit in bytes (None: off) and where it came from."""
    # bad flag values fail before anything is resolved or read
    merge_layers(SamplingParams, [(COMMAND_LINE, sampling_flags)])
    remote = plan_remote(registry, model_name, sampling_flags, load_flags, endpoints, draft)
    if remote is not None:
        return remote
    merge_layers(
        LoadParams, [("default", {"n_ctx": 4096, "n_threads": 1, "n_gpu_layers": 0}), (COMMAND_LINE, load_flags)]
    )
    located = locate(registry, model_name, progress, backend, here)
    _refuse(located, load_flags)
    settings = _settings(located, sampling_flags, load_flags, load_defaults(), context_cap)
    warnings = _warnings(located, settings, here)
    chosen_draft, draft_source = _draft_setting(draft, located.model.entry.draft if located.model.entry else None)
    if located.backend.backend == "mlx" and chosen_draft.mode in ("ngram", "auto"):
        raise UsageError(
            f"`draft` {chosen_draft.mode} (prompt lookup) runs on the GGUF backend; MLX drafts with a draft model",
            "pass an MLX draft model with `draft`, or run a GGUF model",
        )
    draft_model = None
    if chosen_draft.model:
        draft_model = _locate_draft(registry, chosen_draft.model, progress, located.backend, here)
    load = settings.load
    memory = plan(located.header, load.n_ctx, load.kv_type)
    check_loadable(located.header)
    warning = _check_memory(
        located.model.name, memory, load, available_memory() + _workers_free_memory(load.rpc), force
    )
    return RunPlan(
        located.model,
        located.source,
        located.backend.backend,
        located.backend.reason,
        located.header,
        load,
        settings.sampling,
        {**settings.sources, "draft": draft_source, "kv_cache": kv_cache[1]},
        memory,
        (*warnings, *([warning] if warning else [])),
        chosen_draft,
        draft_model,
        kv_cache=kv_cache[0],
    )


def _refuse(located: Located, load_flags: Mapping[str, Any]) -> None:
    """What a located model cannot be asked for: text from an embedding model, MLX's cache on llama.cpp."""
    if is_embedding_model(located.header):
        name = located.model.name
        raise UsageError(
            f"{name} is an embedding model; it makes vectors, not text",
            f"index documents with it: llmrun index add DOCS -c NAME --embed-model {name}",
        )
    if located.backend.backend != "gguf" and load_flags.get("flash_attn") is not None:
        raise UsageError(
            f"`flash_attn` chooses llama.cpp's attention kernel; {located.backend.backend} picks its own",
            "drop `flash_attn` for this model",
        )
    if load_flags.get("flash_attn") is False and load_flags.get("kv_type") not in (None, "f16"):
        raise UsageError(
            "llama.cpp needs flash attention for a quantized KV cache",
            "leave `flash_attn` on or auto, or drop `kv_type`",
        )
    if located.backend.backend == "gguf" and load_flags.get("max_kv_size") is not None:
        raise UsageError(
            "`max_kv_size` is MLX's rotating KV cache; llama.cpp's KV cache is sized by `n_ctx`", "use `n_ctx` N"
        )


@dataclass(frozen=True, slots=True)
class _Settings:
    sampling: SamplingParams
    load: LoadParams
    sources: dict[str, str]  # each setting's layer: default, models.toml, the store, command line
    geometry: Geometry | None


def _settings(
    located: Located,
    sampling_flags: Mapping[str, Any],
    load_flags: Mapping[str, Any],
    load_defaults: Mapping[str, int],
    context_cap: int | None,
) -> _Settings:
    """Sampling and load settings merged by layer: default, models.toml, the model's store, command line."""
    entry, foreign = located.model.entry, located.model.foreign
    store_layer = f"{foreign.source}'s parameters" if foreign else "store"
    store_defaults = {k: v for k, v in (foreign.defaults if foreign else {}).items() if k != "n_ctx"}
    sampling, sources = merge_layers(
        SamplingParams,
        [
            ("models.toml", entry.defaults if entry else {}),
            (store_layer, store_defaults),
            (COMMAND_LINE, sampling_flags),
        ],
    )
    geom = geometry(located.header)
    defaults = dict(load_defaults)
    if load_flags.get("rpc"):
        defaults["n_gpu_layers"] = -1  # every layer on the workers
    defaults["n_ctx"] = min(default_context(geom), context_cap or default_context(geom))
    load, load_sources = merge_layers(
        LoadParams,
        [
            ("default", defaults),
            ("models.toml", {"n_ctx": entry.context} if entry and entry.context else {}),
            (store_layer, {"n_ctx": foreign.defaults["n_ctx"]} if foreign and "n_ctx" in foreign.defaults else {}),
            (COMMAND_LINE, load_flags),
        ],
    )
    return _Settings(sampling, load, {**sources, **load_sources}, geom)


def _warnings(located: Located, settings: _Settings, here: Platform | None) -> list[str]:
    """What the settings will cost: a context past the trained length, RPC, MLX on a CPU."""
    load, geom = settings.load, settings.geometry
    warnings: list[str] = []
    if geom and load.n_ctx > geom.context_train:
        warnings.append(
            f"`n_ctx` {load.n_ctx} is beyond the {geom.context_train} tokens this model was trained on; "
            "expect worse output past that point"
        )
    warnings += _check_rpc(located.backend.backend, load)
    if located.backend.backend == "mlx":
        on_cpu = not (here or select.this_platform()).apple_silicon
        quantized = located.header.metadata.get("mlx.quantization.bits") is not None
        warnings += mlx_warnings(load, settings.sources, geom, quantized_on_cpu=on_cpu and quantized)
    return warnings


def _check_memory(name: str, memory: MemoryPlan, load: LoadParams, available: int, force: bool) -> str | None:
    """Refused when the model does not fit the memory available (a warning with ``force``)."""
    if memory.total_bytes <= available:
        return None
    message = (
        f"{name} needs about {format_bytes(memory.total_bytes)} "
        f"(weights {format_bytes(memory.weight_bytes)} + KV cache {format_bytes(memory.kv_bytes)} "
        f"at {load.n_ctx} tokens + {format_bytes(memory.overhead_bytes)} overhead) "
        f"but {format_bytes(available)} is available"
    )
    if not force:
        raise InsufficientMemory(message, "lower `n_ctx`, or pass `force` to try anyway")
    return message + "; loading anyway (`force`)"


def plan_remote(
    registry: Registry,
    model_name: str | None,
    sampling_flags: Mapping[str, Any],
    load_flags: Mapping[str, Any],
    endpoints: Sequence[str],
    draft: Draft | None,
) -> RunPlan | None:
    """The plan for a model served by remote engines (``--endpoint``, or a models.toml entry with an
    ``endpoint``); None for a local model. Load settings belong to the engine: given, they are refused."""
    from llmrun.models.endpoint import base_url
    from llmrun.models.registry import entry_endpoints

    entry = None
    if endpoints:
        urls, source = tuple(base_url(url) for url in endpoints), COMMAND_LINE
        chosen = tuple(Endpoint(url, model_name) for url in urls)
        name = model_name or "the endpoint's model"
        reason = COMMAND_LINE
    else:
        name, source = (model_name, COMMAND_LINE) if model_name else default_model_name(registry)
        entry = registry.get(name)
        if entry is None or not entry.remote:
            return None
        chosen = entry_endpoints(entry)
        reason = f"models.toml ({entry.source})" if entry.source else "models.toml"
    if load_flags.get("rpc"):
        raise UsageError(
            "`rpc` workers hold the layers of a model run here; a model at an `endpoint` runs in its engine",
            "drop `rpc` (or `endpoint`)",
        )
    given = [key for key, value in load_flags.items() if value is not None and key != "n_ctx"]
    if given:
        raise UsageError(
            f"`{given[0]}` is set by the engine that serves the model, not here", f"drop `{given[0]}` for this model"
        )
    if draft is not None and draft.on:
        raise UsageError(
            "speculative decoding happens inside the engine that serves the model",
            "drop `draft` (turn it on in that engine, e.g. vLLM's speculative_config)",
        )
    sampling, sources = merge_layers(
        SamplingParams, [("models.toml", entry.defaults if entry else {}), (COMMAND_LINE, sampling_flags)]
    )
    n_ctx = load_flags.get("n_ctx") or (entry.context if entry else None) or 4096
    load = LoadParams(n_ctx=n_ctx, n_threads=1, n_gpu_layers=0)
    where = chosen[0].url
    header = GgufHeader(Path(where), 0, {}, (), 0, 0)
    resolved = ResolvedModel(name, Path(where), entry, f"served at {', '.join(e.url for e in chosen)}")
    return RunPlan(
        resolved,
        source,
        "remote",
        reason,
        header,
        load,
        sampling,
        {**sources, "endpoint": reason, "n_ctx": COMMAND_LINE if load_flags.get("n_ctx") else "default"},
        MemoryPlan(0, 0, 0, n_ctx),
        (),
        endpoints=chosen,
    )


def _workers_free_memory(workers: Sequence[str]) -> int:
    """What the `rpc` workers have free (asking them, once per process), so the memory check counts it."""
    if not workers:
        return 0
    from llmrun.backends import rpc  # sockets: only when there are workers

    return sum(worker.free for worker in rpc.workers(workers))


def _check_rpc(backend: str, load: LoadParams) -> list[str]:
    """`rpc` workers run llama.cpp (other backends: refused); a warning when they would get no layer."""
    if not load.rpc:
        return []
    if backend != "gguf":
        raise UsageError(f"`rpc` workers run llama.cpp models; this one runs on {backend}", "drop `rpc`, or run a GGUF")
    if load.n_gpu_layers == 0:
        return ["`n_gpu_layers` 0 keeps every layer here: the `rpc` workers get none"]
    return []


def _draft_setting(command_line: Draft | None, toml: str | None) -> tuple[Draft, str]:
    """The draft setting and where it came from: the command line, else models.toml, else off."""
    if command_line is not None:
        return command_line, COMMAND_LINE
    if toml:
        return Draft.parse(toml), "models.toml"
    return Draft(), "default"


def _locate_draft(
    registry: Registry, name: str, progress: Progress | None, target: Choice, here: Platform | None
) -> ResolvedModel:
    """The draft model, in the form the target's backend runs (speculation happens inside one backend)."""
    located = locate(registry, name, progress, target.backend, here)
    if located.backend.backend != target.backend:
        raise UsageError(
            f"the draft model {name} runs on {located.backend.backend}, the model on {target.backend}",
            "use a draft model in the same format as the model",
        )
    return located.model


def mlx_warnings(
    load: LoadParams, sources: Mapping[str, str], geom: Geometry | None, *, quantized_on_cpu: bool = False
) -> list[str]:
    """Load settings MLX cannot honour as given, one line each (never a silent change)."""
    warnings = []
    if quantized_on_cpu:  # see backends.mlx.expand_on_cpu
        warnings.append(
            "MLX on the CPU: quantized weights are expanded to bfloat16 at load "
            "(mlx's CPU quantized kernels are slow and inexact); memory use is that of the 16-bit model"
        )
    if sources.get("n_threads") == COMMAND_LINE:
        warnings.append("`n_threads` is ignored by the MLX backend (MLX schedules its own threads)")
    if sources.get("n_gpu_layers") == COMMAND_LINE:
        warnings.append("`n_gpu_layers` is ignored by the MLX backend (it places the whole model on its device)")
    if load.kv_type != "f16" and load.max_kv_size:
        warnings.append("`kv_type` is not applied with `max_kv_size`: mlx-lm cannot quantize a rotating cache")
    elif load.kv_type != "f16" and geom and geom.n_swa_layers:
        warnings.append(
            f"`kv_type`: mlx-lm cannot quantize a sliding-window cache, so {geom.n_swa_layers} of "
            f"{geom.n_layers} layers keep a 16-bit KV cache"
        )
    if load.max_kv_size and geom and geom.n_swa_layers and load.max_kv_size < geom.sliding_window:
        warnings.append(
            f"`max_kv_size` {load.max_kv_size} applies to the {geom.n_layers - geom.n_swa_layers} global layers; "
            f"sliding-window layers keep their {geom.sliding_window}-token window"
        )
    return warnings
