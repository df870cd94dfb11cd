"""Loading a planned model: its backend, its draft model (speculative decoding), or a remote engine's client."""

from __future__ import annotations

from pathlib import Path

from llmrun import backends
from llmrun.backends.base import KeepsKv, LoadedModel, LoadParams, SeesImages, Speculates
from llmrun.decoding.speculative import Draft
from llmrun.engine.plan import RunPlan
from llmrun.errors import InsufficientMemory, UsageError, backend_cannot
from llmrun.formats.memory import plan
from llmrun.remote.model import RemoteModel
from llmrun.units import format_bytes


def load_defaults() -> dict[str, int]:
    """Threads and GPU layers when not given: physical cores; all layers when llama.cpp can offload."""
    from llmrun.backends.gguf import gpu_offload_supported
    from llmrun.sysinfo import default_threads

    return {"n_threads": default_threads(), "n_gpu_layers": -1 if gpu_offload_supported() else 0}


def parallel_memory(run_plan: RunPlan, parallel: int) -> int:
    """The plan's memory for ``parallel`` sequences of its context each: weights, KV cache, overhead."""
    return plan(run_plan.header, run_plan.load.n_ctx * parallel, run_plan.load.kv_type).total_bytes


def check_parallel_memory(run_plan: RunPlan, parallel: int, available: int, *, force: bool) -> str | None:
    """``parallel`` sequences of the plan's context each: refused when they do not fit (a warning with ``force``)."""
    total = parallel_memory(run_plan, parallel)
    if total <= available:
        return None
    message = (
        f"{parallel} sequences of {run_plan.load.n_ctx} tokens need about {format_bytes(total)} "
        f"but {format_bytes(available)} is available"
    )
    if not force:
        raise InsufficientMemory(message, "lower `parallel` or `n_ctx`, or pass `force`")
    return message + "; going ahead (`force`)"


Loaded = LoadedModel | RemoteModel
"""A model ready for requests: a backend's (token ids in, tokens out), or a remote engine's (whole requests)."""


def local(model: Loaded, what: str) -> LoadedModel:
    """``model`` when it runs here; one line saying a remote engine cannot do ``what`` when it does not."""
    if isinstance(model, RemoteModel):
        raise backend_cannot(what)
    return model


def load(run_plan: RunPlan) -> Loaded:
    """The plan's model, loaded, with its draft (speculative decoding) attached; a remote engine's,
    connected (nothing is sent until the first request)."""
    if run_plan.backend == "remote":
        return RemoteModel(run_plan.endpoints, n_ctx=run_plan.load.n_ctx, extras=run_plan.extras)
    model = backends.get(run_plan.backend).load(run_plan.model.path, run_plan.load)
    draft_path = run_plan.draft_model.path if run_plan.draft_model is not None else None
    try:
        attach_draft(model, run_plan.backend, run_plan.load, run_plan.draft, draft_path)
        if run_plan.kv_cache:
            attach_kv_store(model, run_plan.model.name, run_plan.load, run_plan.kv_cache)
        if run_plan.mmproj is not None:
            if not isinstance(model, SeesImages):
                raise UsageError(
                    f"the {run_plan.backend} backend reads no images", "run the model's GGUF with its projector"
                )
            model.use_projector(run_plan.mmproj, run_plan.image_max_tokens)
    except BaseException:
        model.close()
        raise
    return model


def attach_kv_store(model: LoadedModel, name: str, params: LoadParams, limit: int) -> None:
    """Keep the model's KV cells on disk, under ``limit`` bytes for every model's (the KV store); a
    backend that cannot runs without it."""
    from llmrun.models.kv_store import KvStore, model_key

    if not isinstance(model, KeepsKv):
        return
    settings = model.kv_settings()
    label = {"model": name, "backend": settings["backend"], "kv_type": params.kv_type}
    model.use_kv_store(KvStore(model_key(model.path, settings), label, limit=limit))


def attach_draft(model: LoadedModel, backend: str, params: LoadParams, draft: Draft, draft_path: Path | None) -> None:
    """Turn speculative decoding on for a loaded model (the draft model loaded with the same settings);
    one line when its backend cannot, or the draft model does not fit it."""
    if not draft.on:
        return
    if not isinstance(model, Speculates):
        raise UsageError(f"the {backend} backend does not decode speculatively", "drop `draft` for this model")
    drafter = backends.get(backend).load(draft_path, params) if draft_path is not None else None
    try:
        model.use_draft(draft, drafter)
    except BaseException:
        if drafter is not None:
            drafter.close()
        raise


def load_vocabulary(path: Path, params: LoadParams, backend: str = "gguf") -> LoadedModel:
    """The model's tokenizer alone (``vocab_only``): tokenize and detokenize, no weights."""
    return backends.get(backend).load(path, params)
