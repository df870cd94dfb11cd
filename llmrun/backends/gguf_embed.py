"""Embeddings from a GGUF embedding model (BERT-style encoders such as all-MiniLM and bge-m3)
through llama-cpp-python's embedding mode: pooled, L2-normalized sentence vectors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.backends.base import outside_vocabulary
from llmrun.backends.gguf import _route_llama_logs
from llmrun.errors import BackendError, UsageError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

SPECIAL_TOKENS = 2  # [CLS] … [SEP] (or <s> … </s>) around every text
MAX_BATCH_TOKENS = 2048  # attention is quadratic in it: bge-m3 at 8192 would want gigabytes


class GgufEmbedder:
    def __init__(self, llama: Any, path: Path) -> None:
        self._llama = llama
        self.path = path
        self.dimension = int(llama.n_embd())
        self.max_tokens = int(llama.n_batch) - SPECIAL_TOKENS
        self.vocab_size = int(llama.n_vocab())

    def count(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def detokenize(self, ids: Sequence[int]) -> str:
        """Token ids of this model's vocabulary as text (the server's token-array input). An id outside the
        vocabulary is a UsageError: llama.cpp would abort the process on it (llama.cpp issue 12178)."""
        bad = outside_vocabulary(ids, self.vocab_size)
        if bad is not None:
            raise UsageError(
                f"token id {ids[bad]} (at {bad}) is not in the model's vocabulary of {self.vocab_size}",
                f"send ids from 0 to {self.vocab_size - 1}",
            )
        return bytes(self._llama.detokenize(list(ids))).decode("utf-8", "replace")

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One unit vector per text; a text longer than ``max_tokens`` is cut (llama-cpp-python's
        ``truncate``), so callers chunk first."""
        import numpy as np

        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        try:
            vectors = self._llama.embed(list(texts), normalize=True, truncate=True)
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"llama.cpp could not embed the text: {exc}", "try `debug`") from exc
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dimension)

    def close(self) -> None:
        self._llama.close()


def load_embedder(path: Path, context: int, n_threads: int) -> GgufEmbedder:
    """Load ``path`` for embedding; ``context`` is the model's trained length (one text at most),
    and also the batch: several short texts share one forward pass."""
    from llama_cpp import Llama

    from llmrun.backends.llama_build import avoid_extra_buffers

    _route_llama_logs()
    n_batch = max(min(context, MAX_BATCH_TOKENS), 16)
    try:
        with avoid_extra_buffers():
            llama = Llama(
                model_path=str(path),
                embedding=True,
                n_ctx=n_batch,
                n_batch=n_batch,
                n_ubatch=n_batch,  # an encoder sees a whole text in one micro-batch
                n_threads=n_threads,
                n_threads_batch=n_threads,
                verbose=False,
            )
    except (ValueError, RuntimeError, OSError) as exc:
        raise BackendError(
            f"llama.cpp could not load {path.name} as an embedding model: {exc}",
            "the file may be corrupt; try `debug`",
        ) from exc
    return GgufEmbedder(llama, path)


if TYPE_CHECKING:  # what this embedder offers, as mypy checks it against the protocols
    from llmrun.backends.base import Embedder, ReadsTokens

    def _capabilities(embedder: GgufEmbedder) -> tuple[Embedder, ReadsTokens]:
        return embedder, embedder
