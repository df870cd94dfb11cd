"""Choosing the embedding model: a models.toml name, a Hub repo or a local GGUF, resolved and
pulled like any model, and checked to be an embedding model (a GGUF with a pooling type)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import UsageError
from llmrun.rag.index import EmbeddingModel

if TYPE_CHECKING:
    from llmrun.backends.base import Embedder
    from llmrun.config import Registry
    from llmrun.store import Progress


def embedding_model(registry: Registry, name: str, progress: Progress | None = None) -> EmbeddingModel:
    """The embedding model ``name`` (the registry's default when empty), resolved to a local GGUF."""
    from llmrun.gguf_header import is_embedding_model
    from llmrun.pipeline import locate

    name = name or registry.default_embedding
    if Path(name).expanduser().is_dir():
        raise UsageError(
            f"{name} is a model directory; llmrun embeds with GGUF embedding models",
            f"convert it first: llmrun convert {name} --to gguf -o model-f16.gguf",
        )
    located = locate(registry, name, progress, backend="gguf")
    header = located.header
    if not is_embedding_model(header):
        raise UsageError(
            f"{name} is a {header.architecture} text-generation model, not an embedding model",
            f"use an embedding model: --embed-model {registry.default_embedding}, or bge-m3 (multilingual)",
        )
    context = header.arch_value("context_length")
    path = located.model.path

    def open_embedder() -> Embedder:
        from llmrun.backends.gguf_embed import load_embedder
        from llmrun.sysinfo import default_threads

        return load_embedder(path, int(context) if isinstance(context, int) else 512, default_threads())

    return EmbeddingModel(located.model.name, path, open_embedder)
