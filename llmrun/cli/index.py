"""``llmrun index``: build, list, remove and search the document collections behind ``--rag``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmrun.cli import options as o

if TYPE_CHECKING:
    from llmrun.rag.index import AddReport, EmbeddingModel
    from llmrun.rag.store import Hit

app = typer.Typer(
    name="index",
    help="Index local documents for answers grounded in them (llmrun run --rag NAME).",
    no_args_is_help=True,
)


def model_opener() -> Any:
    """``name → EmbeddingModel``, resolving (and pulling, with progress) through the registry."""
    from llmrun.cli import bars
    from llmrun.models.registry import load_registry
    from llmrun.rag.embedding import embedding_model

    registry = load_registry()

    def open_model(name: str) -> EmbeddingModel:
        with bars.download_progress() as progress:
            return embedding_model(registry, name, progress)

    return open_model


@app.command("add")
def add(
    paths: Annotated[list[Path], typer.Argument(help="Files and folders (walked recursively).", show_default=False)],
    collection: Annotated[
        str, typer.Option("--collection", "-c", help="The collection to add to (created if new).", show_default=False)
    ],
    embed_model: Annotated[
        str | None,
        typer.Option(
            "--embed-model",
            help="Embedding model: a models.toml name, Hub repo or .gguf (llama.cpp), or a BERT directory (MLX). "
            "Default: models.toml's default_embedding for a new collection, the collection's own otherwise.",
            show_default=False,
        ),
    ] = None,
    chunk_tokens: Annotated[
        int, typer.Option("--chunk-tokens", min=16, max=8192, help="Largest chunk, in the embedding model's tokens.")
    ] = 256,
    overlap: Annotated[
        int, typer.Option("--overlap", min=0, help="Tokens a chunk repeats from the one before it.")
    ] = 32,
    store: o.StoreOpt = None,
    json_output: o.JsonOpt = False,
) -> None:
    """Index text, Markdown, source code and PDF files into a collection.

    Re-running embeds only new and changed files and drops the chunks of files deleted from the folders given.

    Examples:

      llmrun index add ~/notes -c notes

      llmrun index add docs/ README.md -c project --embed-model bge-m3
    """
    from llmrun.cli import bars, render
    from llmrun.rag import index
    from llmrun.rag.store import check_name
    from llmrun.rag.stores import open_store

    check_name(collection)
    opener = model_opener()
    chosen = opener(embed_model) if embed_model else None
    vector_store = open_store(store)
    with bars.work_progress() as progress:
        report = index.add(vector_store, collection, paths, chosen, opener, chunk_tokens, overlap, progress)
    for skipped in report.skipped:
        render.note(f"skipped {skipped.path}: {skipped.why}")
    if json_output:
        render.print_json(_add_json(report))
        return
    _print_add(report, vector_store.location)


def _add_json(report: AddReport) -> dict[str, Any]:
    return {
        "collection": report.collection,
        "embed_model": report.embed_model,
        "dimension": report.dimension,
        "created": report.created,
        "indexed": report.indexed,
        "unchanged": report.unchanged,
        "removed": report.removed,
        "skipped": [{"path": str(s.path), "why": s.why} for s in report.skipped],
        "chunks_embedded": report.chunks,
        "chunks_per_second": round(report.chunks_per_second, 1),
        "seconds": round(report.seconds, 3),
    }


def _print_add(report: AddReport, location: str) -> None:
    from llmrun.cli import render

    verb = "created" if report.created else "updated"
    render.note(
        f"{verb} collection {report.collection} ({report.embed_model}, {report.dimension} dimensions) in {location}"
    )
    rate = f" ({report.chunks_per_second:.1f} chunks/s)" if report.chunks else ""
    render.note(
        f"{len(report.indexed)} files indexed, {report.chunks} chunks embedded{rate}; "
        f"{report.unchanged} unchanged, {len(report.removed)} removed, {len(report.skipped)} skipped; "
        f"{report.seconds:.1f} s"
    )
    if not report.indexed and not report.unchanged and not report.removed:
        render.warn("no documents found to index")


@app.command("ls")
def ls(store: o.StoreOpt = None, json_output: o.JsonOpt = False) -> None:
    """List the collections: embedding model, files, chunks."""
    from llmrun.cli import render
    from llmrun.rag.stores import open_store

    vector_store = open_store(store)
    infos = []
    for name in vector_store.names():
        collection = vector_store.open(name)
        if collection is not None:
            infos.append(collection.info)
            collection.close()
    rows = [
        {
            "name": i.name,
            "embed_model": i.embed_model,
            "dimension": i.dimension,
            "files": i.files,
            "chunks": i.chunks,
            "chunk_tokens": i.chunk_tokens,
            "overlap": i.overlap,
        }
        for i in infos
    ]
    if json_output:
        render.print_json({"store": vector_store.location, "collections": rows})
        return
    if not rows:
        render.note(f"no collections in {vector_store.location}; make one: llmrun index add DOCS -c NAME")
        return
    render.table(
        f"Collections in {vector_store.location}",
        ["name", "embedding model", "dims", "files", "chunks", "chunk tokens"],
        [
            (
                r["name"],
                r["embed_model"],
                r["dimension"],
                r["files"],
                r["chunks"],
                f"{r['chunk_tokens']}/{r['overlap']}",
            )
            for r in rows
        ],
        stdout=True,
    )


@app.command("rm")
def rm(
    name: Annotated[str, typer.Argument(help="The collection to delete.", show_default=False)],
    store: o.StoreOpt = None,
) -> None:
    """Delete a collection (its vectors and texts; the documents are not touched)."""
    from llmrun.cli import render
    from llmrun.errors import UsageError
    from llmrun.rag.store import check_name
    from llmrun.rag.stores import open_store

    check_name(name)
    vector_store = open_store(store)
    if not vector_store.remove(name):
        known = vector_store.names()
        raise UsageError(f"no collection named {name!r}", f"collections: {', '.join(known) or 'none'}")
    render.note(f"removed collection {name}")


@app.command("query")
def query(
    name: Annotated[str, typer.Argument(help="The collection to search.", show_default=False)],
    text: Annotated[str, typer.Argument(help="What to look for.", show_default=False)],
    k: o.TopChunksOpt = 5,
    min_score: o.MinScoreOpt = -1.0,
    store: o.StoreOpt = None,
    json_output: o.JsonOpt = False,
) -> None:
    """Show the chunks nearest to TEXT, best first, with scores and sources.

    Example:

      llmrun index query notes "how do I rotate the backup keys?" -k 3
    """
    from llmrun.cli import render, views
    from llmrun.rag import index
    from llmrun.rag.stores import open_store

    info, hits = index.query(open_store(store), name, text, k, model_opener())
    hits = [hit for hit in hits if hit.score >= min_score]
    if json_output:
        render.print_json({"collection": info.name, "embed_model": info.embed_model, "hits": hit_rows(hits)})
        return
    views.hits(hits)


def hit_rows(hits: list[Hit]) -> list[dict[str, Any]]:
    return [
        {
            "rank": i,
            "score": round(h.score, 4),
            "path": h.path,
            "start": h.start,
            "end": h.end,
            "unit": h.unit,
            "text": h.text,
        }
        for i, h in enumerate(hits, start=1)
    ]


def retrieve(name: str, question: str, k: int, store: str | None, min_score: float = -1.0) -> list[Hit]:
    """The top ``k`` chunks of collection ``name`` for ``question`` scoring at least ``min_score``
    (for run --rag and chat /rag); a warning when none does."""
    from llmrun.cli import render
    from llmrun.rag import index
    from llmrun.rag.stores import open_store

    with render.status(f"Searching {name}…"):
        _, hits = index.query(open_store(store), name, question, k, model_opener())
    kept = [hit for hit in hits if hit.score >= min_score]
    if hits and not kept:
        render.warn(f"no passage in {name} scores {min_score} or more (best: {hits[0].score:.2f}); answering without")
    return kept


def token_counter(model: Any) -> Callable[[str], int]:
    """How many tokens a text is for ``model``: its tokenizer, or for a remote engine (whose tokenizer is
    at the endpoint) :func:`llmrun.rag.context.estimated_tokens`."""
    from llmrun.remote.model import RemoteModel

    if isinstance(model, RemoteModel):
        from llmrun.rag.context import estimated_tokens

        return estimated_tokens
    return lambda text: len(model.tokenize(text))


def grounded_prompt(question: str, hits: list[Hit], model: Any, n_ctx: int, max_tokens: int, extra: int = 0) -> Any:
    """The prompt for ``question`` with the retrieved passages that fit ``model``'s context
    (:func:`llmrun.rag.context.ground`), saying when it had to trim."""
    from llmrun.cli import render
    from llmrun.rag.context import ground

    context = ground(question, hits, token_counter(model), n_ctx, max_tokens, extra)
    if context.note():
        render.warn(context.note())
    return context
