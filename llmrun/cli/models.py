"""``llmrun show``: what a model is, and the memory it needs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmrun.backends.base import KV_TYPES
from llmrun.cli import complete
from llmrun.cli import options as o
from llmrun.errors import UsageError

if TYPE_CHECKING:
    from llmrun.formats.gguf_header import GgufHeader


def show(
    model: Annotated[
        str | None,
        typer.Argument(
            help="Model alias, .gguf path or MLX directory. Default: the default model.",
            autocompletion=complete.model_names,
        ),
    ] = None,
    ctx: o.CtxOpt = None,
    backend: o.BackendOpt = "auto",
    json_output: o.JsonOpt = False,
    template: Annotated[
        bool,
        typer.Option(
            "--template",
            help="Print the chat template and a sample conversation rendered through it, special tokens highlighted.",
        ),
    ] = False,
) -> None:
    """Architecture, size, tensor types, chat template, licence, and a memory plan.

    The plan: weights + KV cache (for f16, q8_0 and q4_0 caches) + compute buffers,
    against available memory, and the largest context that fits.

    Examples: llmrun show gemma3:270m --ctx 8192;  llmrun show smollm2:135m --template
    """
    from llmrun.cli import render, views
    from llmrun.engine.plan import locate
    from llmrun.formats.memory import (
        default_context,
        geometry,
        kv_cache_bytes,
        largest_context,
        parameter_count,
        plan,
        weights_by_type,
    )
    from llmrun.models.registry import load_registry
    from llmrun.models.store import recorded_sha256
    from llmrun.sysinfo import available_memory

    if ctx is not None and ctx < 16:
        raise UsageError(f"--ctx must be an integer >= 16, got {ctx}", "pass a larger context")
    registry = load_registry()
    entry = registry.get(model) if model else None
    if entry is not None and entry.remote:
        if template:
            from llmrun.engine.plan import remote_refusal

            raise remote_refusal(entry.name, entry.endpoints)
        _show_remote(entry, json_output)
        return
    with render.status("Reading the model…"):
        located = locate(load_registry(), model, backend=backend)
    if template:
        _show_template(located, json_output)
        return
    header, resolved = located.header, located.model
    geom = geometry(header)
    n_ctx = ctx or (resolved.entry.context if resolved.entry and resolved.entry.context else default_context(geom))
    available = available_memory()
    entry = resolved.entry
    facts: dict[str, Any] = {
        "name": resolved.name,
        "path": str(resolved.path),
        "file_size": header.file_size,
        "sha256": recorded_sha256(resolved.path) or _indexed_sha256(resolved.path),
        "architecture": header.architecture,
        "backend": located.backend.backend,
        "model_name": header.metadata.get("general.name"),
        "parameters": parameter_count(header),
        "context_length": geom.context_train if geom else None,
        "layers": geom.n_layers if geom else None,
        "kv_heads": geom.n_kv_heads if geom else None,
        "head_dim": geom.head_dim_k if geom else None,
        "sliding_window": (
            {"window": geom.sliding_window, "layers": geom.n_swa_layers} if geom and geom.sliding_window else None
        ),
        "vocabulary": geom.n_vocab if geom else None,
        "chat_template": bool(header.chat_template or (entry and entry.template)),
        "tool_calls": _tool_dialect(located),
        "embedding": _embedding(header),
        "mmproj": _projector(resolved),  # its projector: it reads images
        "license": (entry.license if entry and entry.license else None) or header.metadata.get("general.license"),
        "tensor_types": {name: {"tensors": c, "bytes": b} for name, (c, b) in weights_by_type(header).items()},
    }
    plans = {kv: plan(header, n_ctx, kv) for kv in KV_TYPES}
    memory = {
        "context": n_ctx,
        "available_bytes": available,
        "by_kv_type": {
            kv: {
                "weights_bytes": p.weight_bytes,
                "kv_cache_bytes": p.kv_bytes,
                "kv_cache_windowed_bytes": kv_cache_bytes(geom, n_ctx, kv, swa_full=False) if geom else None,
                "compute_bytes": p.overhead_bytes,
                "total_bytes": p.total_bytes,
                "fits": p.total_bytes <= available,
                "largest_context": largest_context(header, available, kv),
            }
            for kv, p in plans.items()
        },
    }
    if json_output:
        render.print_json({**facts, "memory_plan": memory})
        return
    views.model_facts(facts)
    views.memory_plan(memory)


def _tool_dialect(located: Any) -> dict[str, str]:
    """How the model writes tool calls, as its chat template shows (the generic dialect where it shows none)."""
    from llmrun.engine.request import templates_for
    from llmrun.structured.dialects import dialect_for

    dialect = dialect_for(templates_for(located.model.entry, located.header).conversation or "")
    return {"dialect": dialect.name, "family": dialect.family}


def _projector(resolved: Any) -> str | None:
    """The projector the model's listing names (models.toml's ``mmproj``, pulled with it, another store's)."""
    listed = resolved.projector
    return str(listed[0]) if listed is not None else None


def _show_remote(entry: Any, json_output: bool) -> None:
    """A models.toml entry served by remote engines: what each endpoint says about the model."""
    from llmrun.cli import render
    from llmrun.models.registry import entry_endpoints
    from llmrun.remote.info import describe

    with render.status("Asking the endpoint…"):
        cards = [describe(endpoint) for endpoint in entry_endpoints(entry)]
    if json_output:
        render.print_json({"name": entry.name, "backend": "remote", "endpoints": cards})
        return
    rows = []
    for card in cards:
        rows += [
            ("endpoint", card["endpoint"]),
            ("model", card["model"] or f"(one of: {', '.join(card['served'])})"),
            ("context", f"{card['context_length']:,} tokens" if card["context_length"] else "not reported"),
            ("slots", str(card["slots"]) if card["slots"] else "not reported"),
            ("key", f"from {card['key']}" if card["key"] else "none"),
        ]
    render.table(f"{entry.name} (remote)", ["", ""], rows, header=False)


SAMPLE_CONVERSATION = (
    ("system", "You are a helpful assistant."),
    ("user", "Hello!"),
    ("assistant", "Hi! How can I help?"),
    ("user", "What is 2 + 2?"),
)


def _show_template(located: Any, json_output: bool) -> None:
    """The template a conversation with the model goes through, and a sample rendered by it."""
    from llmrun.backends.base import LoadParams
    from llmrun.cli import render, views
    from llmrun.engine.load import load_vocabulary
    from llmrun.engine.request import templates_for
    from llmrun.prompt.render import render_prompt
    from llmrun.prompt.template import Message

    templates = templates_for(located.model.entry, located.header)
    text, source = templates.conversation, templates.conversation_source
    with render.status("Rendering a sample…"):
        vocab = load_vocabulary(located.model.path, LoadParams(512, 1, 0, vocab_only=True), located.backend.backend)
        try:
            prompt = render_prompt(vocab, text, [Message(role, content) for role, content in SAMPLE_CONVERSATION])
            if json_output:
                render.print_json(
                    {"name": located.model.name, "source": source, "template": text, "sample": prompt.text}
                )
                return
            render.note(f"chat template: {source}")
            render.out_console().print(text, markup=False, highlight=False)
            render.note("a sample conversation, as the model reads it:")
            views.prompt_view(vocab, prompt.ids, render.out_console())
        finally:
            vocab.close()


def pull(
    model: Annotated[str, typer.Argument(help="alias[:tag][-quant], owner/repo[:QUANT], or owner/repo/file.gguf")],
    backend: o.BackendOpt = "auto",
    no_mmproj: Annotated[
        bool,
        typer.Option(
            "--no-mmproj",
            help="Do not fetch the repo's projector (mmproj GGUF) with the model: it will not read images.",
        ),
    ] = False,
) -> None:
    """Download a model from the Hugging Face Hub into the local store, verified by sha256 (with its
    projector, when the repo has one: a vision model then reads images as pulled).

    Example: llmrun pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0
    """
    from llmrun.cli import bars, render
    from llmrun.engine import select
    from llmrun.models.refs import ModelRef
    from llmrun.models.registry import load_registry
    from llmrun.models.resolve import resolve

    ref = ModelRef.parse(model)
    if ref.kind == "path":
        raise UsageError(f"{model} is a local path", "pull takes a model name; run a file with llmrun run -m PATH")
    registry = load_registry()
    choice = select.choose_for(backend, model, ref, registry)
    with bars.download_progress() as progress:
        resolved = resolve(ref, registry, progress, choice.backend, mmproj=not no_mmproj)
    detail = resolved.detail or resolved.name
    render.note(detail if detail.startswith(resolved.name) else f"{resolved.name}: {detail}")
    render.note(str(resolved.path))
    if resolved.mmproj is not None:
        render.note(f"{resolved.mmproj} (its projector: it reads images, llmrun run --image FILE)")


def list_models(
    json_output: o.JsonOpt = False,
    everything: Annotated[
        bool,
        typer.Option(
            "--all", "-a", help="Also the models Ollama, LM Studio and the Hugging Face cache hold (run in place)."
        ),
    ] = False,
) -> None:
    """The models in the local store: name, quant, size, when pulled, where."""
    from llmrun.cli import render, views
    from llmrun.errors import StoreError
    from llmrun.models.store import entry_files, read_index
    from llmrun.paths import store_dir

    rows = []
    try:
        pulled = read_index()
    except StoreError as exc:  # the embedded models are listed all the same
        render.warn(f"{exc.message} — {exc.hint}")
        pulled = {}
    for name, entry in sorted(pulled.items()):
        size = sum(f["size"] for f in entry["files"])
        projector = entry.get("mmproj")
        present = all(Path(f["path"]).is_file() for f in entry_files(entry))
        rows.append({
            "name": name, "format": entry.get("format", "gguf"),
            "repo": entry["repo"] or f"(made here from {entry.get('source', '?')})",
            "files": [f["name"] for f in entry["files"]], "quant": entry.get("quant"),
            "mmproj": projector["name"] if projector else None,
            "size": size, "pulled": entry["pulled"],
            "path": str(Path(entry["files"][0]["path"]).parent) if entry.get("format") == "mlx"
            else entry["files"][0]["path"],
            "present": present,
        })  # fmt: skip
    rows += _packaged_rows()
    for gguf in sorted((store_dir() / "embedded").glob("*.gguf")):
        stat = gguf.stat()
        rows.append({
            "name": gguf.name, "format": "gguf", "repo": "(embedded package)", "files": [gguf.name],
            "size": stat.st_size, "pulled": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stat.st_mtime)),
            "path": str(gguf), "present": True,
        })  # fmt: skip
    rows += _remote_rows()
    if everything:
        rows += _foreign_rows()
    if json_output:
        render.print_json(rows)
        return
    if not rows:
        render.note("no models yet: `llmrun pull NAME`, or `llmrun run` the embedded gemma3:270m")
        return
    views.models_table(rows)


def _foreign_rows() -> list[dict[str, Any]]:
    """Other tools' models (read where they are; a damaged one is listed as such)."""
    from llmrun.models.otherstores import huggingface_ggufs, lmstudio_models, ollama_models

    rows = []
    for listed in [*ollama_models(), *lmstudio_models(), *huggingface_ggufs()]:
        modified = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(listed.modified)) if listed.modified else ""
        rows.append({
            "name": listed.name, "format": "gguf", "repo": f"({listed.source})",
            "files": [listed.path.name if listed.path else listed.name], "size": listed.size,
            "pulled": modified, "path": str(listed.path) if listed.path else f"({listed.source}: damaged)",
            "present": listed.path is not None, "source": listed.source,
        })  # fmt: skip
    return rows


def _remote_rows() -> list[dict[str, Any]]:
    """models.toml entries served by remote engines (listed without asking them: `llmrun show NAME` does)."""
    from llmrun.models.registry import load_registry

    rows = []
    for entry in sorted(load_registry().models.values(), key=lambda e: e.name):
        if entry.remote:
            rows.append({
                "name": entry.name, "format": "remote", "repo": "(remote engine)", "files": [entry.served or ""],
                "quant": entry.served or "(its only model)", "size": None, "pulled": "",
                "path": ", ".join(entry.endpoints), "present": True,
            })  # fmt: skip
    return rows


def _packaged_rows() -> list[dict[str, Any]]:
    """Models that installed PyPI packages carry (models.toml ``package``), once llmrun has used them."""
    from llmrun.models.packaged import on_disk
    from llmrun.models.registry import load_registry
    from llmrun.paths import store_dir

    rows = []
    for entry in load_registry().models.values():
        path = on_disk(entry.name, entry.package, store_dir() / "packaged") if entry.package else None
        if entry.package is None or path is None:
            continue
        stat = path.stat()
        rows.append({
            "name": entry.name, "format": "gguf",
            "repo": f"(package {entry.package.install})", "files": [path.name], "size": stat.st_size,
            "pulled": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(stat.st_mtime)),
            "path": str(path), "present": True,
        })  # fmt: skip
    return rows


def rm(
    model: Annotated[
        str, typer.Argument(help="A name as `llmrun list` shows it.", autocompletion=complete.pulled_names)
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Remove a pulled model and its files (only files no other model uses)."""
    from llmrun.cli import render
    from llmrun.errors import ModelNotFound
    from llmrun.models import pull as pulling
    from llmrun.models.store import read_index

    key = model.strip()
    if key not in read_index():
        raise ModelNotFound(f"{key} is not in the local store", "`llmrun list` shows what is")
    if not yes:
        if sys.stdin is None or not sys.stdin.isatty():
            raise UsageError(f"removing {key} needs confirmation", "pass --yes")
        if not typer.confirm(f"Remove {key} and its files?", default=False):
            raise typer.Exit(1)
    removed = pulling.remove(key)
    render.note(f"removed {key} ({len(removed)} file(s))")


def _indexed_sha256(path: Path) -> str | None:
    """The sha256 the Hub published for a pulled file (checked when it was pulled)."""
    from llmrun.models.store import entry_files, read_index

    for entry in read_index().values():
        for f in entry_files(entry):
            if f["path"] == str(path):
                sha: str | None = f.get("sha256")
                return sha
    return None


def _embedding(header: GgufHeader) -> str | None:
    """What an embedding model makes ("384-dimension vectors, mean pooling"), else None."""
    from llmrun.formats.gguf_header import is_embedding_model

    if not is_embedding_model(header):
        return None
    pooling = {0: "no", 1: "mean", 2: "CLS", 3: "last-token", 4: "rank"}.get(header.arch_value("pooling_type"), "its")
    return f"{header.arch_value('embedding_length')}-dimension vectors, {pooling} pooling (llmrun index --embed-model)"
