"""Choosing the embedding model: a models.toml name, a Hub repo or a local GGUF (llama.cpp),
resolved and pulled like any model and checked to be an embedding model (a GGUF with a pooling
type); or a Hugging Face BERT directory (MLX)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import UsageError
from llmrun.rag.index import EmbeddingModel

if TYPE_CHECKING:
    from llmrun.backends.base import Embedder
    from llmrun.files import Progress
    from llmrun.models.registry import Registry


def _mlx_model(directory: Path) -> EmbeddingModel:
    """A Hugging Face BERT directory, embedded on MLX (Apple silicon, or mlx[cpu] on Linux)."""
    from llmrun.backends.mlx_embed import is_bert_dir
    from llmrun.engine.select import this_platform

    if not is_bert_dir(directory):
        raise UsageError(
            f"{directory} is not an embedding model directory llmrun can run (a BERT model with tokenizer.json)",
            "pass a GGUF embedding model, e.g. `embed_model` all-minilm:l6-v2",
        )
    if not this_platform().mlx_installed:
        raise UsageError(
            f"{directory} is a model directory, which runs on MLX, and MLX is not installed",
            f"pip install 'llmrun[mlx]', or convert it: llmrun convert {directory} --to gguf -o model-f16.gguf",
        )

    def open_embedder() -> Embedder:
        from llmrun.backends.mlx_embed import load_embedder

        return load_embedder(directory)

    return EmbeddingModel(str(directory.resolve()), directory, open_embedder)


def embedding_model(registry: Registry, name: str, progress: Progress | None = None) -> EmbeddingModel:
    """The embedding model ``name`` (the registry's default when empty), resolved to a local GGUF."""
    from llmrun.engine.plan import locate
    from llmrun.formats.gguf_header import is_embedding_model

    name = name or registry.default_embedding
    if Path(name).expanduser().is_dir():
        return _mlx_model(Path(name).expanduser())
    located = locate(registry, name, progress, backend="gguf")
    header = located.header
    if not is_embedding_model(header):
        raise UsageError(
            f"{name} is a {header.architecture} text-generation model, not an embedding model",
            f"use an embedding model: `embed_model` {registry.default_embedding}, or bge-m3 (multilingual)",
        )
    context = header.arch_value("context_length")
    path = located.model.path

    def open_embedder() -> Embedder:
        from llmrun.backends.gguf_embed import load_embedder
        from llmrun.sysinfo import default_threads

        return load_embedder(path, int(context) if isinstance(context, int) else 512, default_threads())

    # a file is recorded by its absolute path, so the collection can be queried from anywhere
    recorded = str(path.resolve()) if Path(name).expanduser().is_file() else located.model.name
    return EmbeddingModel(recorded, path, open_embedder)
