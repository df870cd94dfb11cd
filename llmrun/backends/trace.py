"""One forward pass seen from inside: what ``llmrun look`` captures, and the capability that captures it.

A backend that :class:`Looks` runs a prompt once and returns a :class:`Trace`: every
layer's attention weights (the softmax of query · key, per head) and every layer's output
(the residual stream the next layer reads). It also applies its final norm and output head to any
residual rows (:meth:`Looks.lens`, the logit lens) and reads its token embedding matrix
in chunks (nearest tokens). :class:`TopK` keeps what is shown of a distribution over a
whole vocabulary without holding it: the top ids, their probabilities, and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from llmrun.errors import backend_cannot

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    F32 = npt.NDArray[np.float32]

ATTENTION_BUDGET = 1 << 30  # bytes of attention weights one capture keeps (all layers of ~1,000 tokens on Gemma 3)


@dataclass(frozen=True, slots=True)
class Geometry:
    """The shape of a model's forward pass, as ``look`` describes it."""

    architecture: str
    n_layer: int
    n_head: int
    n_head_kv: int  # fewer than n_head: grouped-query attention, head h reads K/V head h // (n_head // n_head_kv)
    n_embd: int
    n_vocab: int
    sliding_window: int  # 0: every layer attends to the whole prompt
    rope: str  # "neox", "norm", … ; "" when positions do not enter by rotation
    rope_base: float


@dataclass(frozen=True, slots=True)
class TopK:
    """The top of one distribution per row: ids (rows, k) best first and their probabilities."""

    ids: npt.NDArray[np.int64]
    probs: F32


@dataclass(slots=True)
class Trace:
    """What one forward pass over ``ids`` computed."""

    ids: tuple[int, ...]
    geometry: Geometry
    attention: dict[int, F32]  # layer → (heads, queries, keys) weights; keys after the query are 0
    hidden: F32  # (layers, positions, n_embd): each layer's output
    final: TopK | None  # the model's own next-token distribution after each position, where the pass ran its head
    seconds: float = 0.0  # the forward pass with its capture
    notes: list[str] = field(default_factory=list)  # what could not be captured, and why
    complete: bool = True  # every layer's output was captured (else the logit lens cannot be shown)


class TopKAccumulator:
    """The top ``k`` of softmax(logits) per row, over logits that arrive in column chunks (vocabulary
    slices): a running log-sum-exp and a running top-k, so no row of the whole vocabulary is ever held."""

    def __init__(self, rows: int, k: int) -> None:
        import numpy as np

        self.k = k
        self._max = np.full(rows, -np.inf, dtype=np.float64)
        self._sum = np.zeros(rows, dtype=np.float64)
        self._ids = np.zeros((rows, 0), dtype=np.int64)
        self._logits = np.zeros((rows, 0), dtype=np.float64)

    def add(self, start: int, logits: F32) -> None:
        """Columns ``start … start + logits.shape[1]`` of every row."""
        import numpy as np

        chunk = np.asarray(logits, dtype=np.float32)
        top = min(self.k, chunk.shape[1])
        chunk_max = chunk.max(axis=1).astype(np.float64)
        new_max = np.maximum(self._max, chunk_max)
        shifted = np.exp(chunk - new_max.astype(np.float32)[:, None])
        self._sum = self._sum * np.exp(self._max - new_max) + shifted.sum(axis=1, dtype=np.float64)
        self._max = new_max
        best = _top_columns(chunk, top)
        ids = np.concatenate([self._ids, best + start], axis=1)
        values = np.concatenate([self._logits, np.take_along_axis(chunk, best, axis=1).astype(np.float64)], axis=1)
        keep = np.argsort(-values, axis=1, kind="stable")[:, : self.k]
        self._ids = np.take_along_axis(ids, keep, axis=1)
        self._logits = np.take_along_axis(values, keep, axis=1)

    def result(self) -> TopK:
        import numpy as np

        log_z = self._max + np.log(self._sum)
        return TopK(self._ids.copy(), np.exp(self._logits - log_z[:, None]).astype(np.float32))


_BLOCK = 1024


def _top_columns(chunk: F32, k: int) -> npt.NDArray[np.int64]:
    """The columns of each row's ``k`` largest values (in no order), without partitioning whole rows: the
    ``k`` blocks of :data:`_BLOCK` columns with the largest maxima hold them, so only those (and the
    columns after the last whole block) are searched."""
    import numpy as np

    rows, cols = chunk.shape
    blocks = cols // _BLOCK
    if blocks <= k:
        return np.argpartition(chunk, -k, axis=1)[:, -k:].astype(np.int64)
    whole = chunk[:, : blocks * _BLOCK].reshape(rows, blocks, _BLOCK)
    best_blocks = np.argpartition(whole.max(axis=2), -k, axis=1)[:, -k:]  # (rows, k)
    columns = (best_blocks[:, :, None] * _BLOCK + np.arange(_BLOCK)[None, None, :]).reshape(rows, -1)
    columns = np.concatenate(
        [columns, np.broadcast_to(np.arange(blocks * _BLOCK, cols), (rows, cols - blocks * _BLOCK))], 1
    )
    values = np.take_along_axis(chunk, columns, axis=1)
    picked = np.argpartition(values, -k, axis=1)[:, -k:]
    result: npt.NDArray[np.int64] = np.take_along_axis(columns, picked, axis=1).astype(np.int64)
    return result


def top_k(logits: F32, k: int) -> TopK:
    """The top ``k`` of softmax over each row of a whole (rows, vocabulary) array."""
    acc = TopKAccumulator(logits.shape[0], k)
    acc.add(0, logits)
    return acc.result()


def attention_layers(layers: Sequence[int] | None, geometry: Geometry, n_tokens: int) -> list[int]:
    """The layers whose attention a capture keeps: ``layers`` (None: all), within the attention budget."""
    from llmrun.errors import UsageError

    chosen = list(range(geometry.n_layer)) if layers is None else sorted(set(layers))
    size = len(chosen) * geometry.n_head * n_tokens * n_tokens * 4
    if size > ATTENTION_BUDGET:
        raise UsageError(
            f"the attention of {len(chosen)} layers over {n_tokens} tokens takes {size / 2**30:.1f} GiB",
            "look at one layer (`layer`), or shorten the prompt",
        )
    return chosen


def check_window(geometry: Geometry, n_tokens: int) -> None:
    """A prompt within the model's sliding window, so every layer sees all of it (and, in llama.cpp's
    cache, key cell i is position i)."""
    from llmrun.errors import UsageError

    if geometry.sliding_window and n_tokens > geometry.sliding_window:
        raise UsageError(
            f"the prompt has {n_tokens} tokens, more than this model's sliding window of {geometry.sliding_window}",
            f"look at most {geometry.sliding_window} tokens at a time",
        )


@runtime_checkable
class Looks(Protocol):
    """A model whose forward pass can be looked into (``llmrun look``)."""

    def geometry(self) -> Geometry: ...

    def trace(self, ids: Sequence[int], layers: Sequence[int], top: int) -> Trace:
        """One forward pass over ``ids`` keeping the attention of ``layers`` and every layer's output (and,
        where the pass runs the output head anyway, the top ``top`` of its distribution at every position)."""
        ...

    def lens(self, hidden: F32, top: int) -> TopK:
        """The final norm and the output head applied to residual rows (rows, n_embd): the logit lens."""
        ...

    def embedding(self, ids: Sequence[int]) -> F32:
        """The token embedding matrix's rows for ``ids`` (len(ids), n_embd)."""
        ...

    def embedding_rows(self, chunk: int = 16384) -> Iterator[tuple[int, F32]]:
        """The token embedding matrix, ``chunk`` rows at a time: (first id, rows)."""
        ...


def looking(model: object) -> Looks:
    if not isinstance(model, Looks):
        raise backend_cannot("show what happens inside its forward pass")
    return model
