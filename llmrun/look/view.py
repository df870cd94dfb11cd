"""One forward pass looked into: run the capture and assemble what ``llmrun look`` shows.

The logit lens applies the model's final norm and output head to every layer's output.
Its last layer is the model's own distribution: from the captured pass where that ran the
output head (MLX), else from a plain pass over every position (llama.cpp's capture stops
before the head, which over Gemma 3's 262,144 tokens costs more than all its layers, and runs
without flash attention, which a plain pass may use); at the last position always as
``llmrun next`` computes it (the same call). The lens of the last layer is checked against it:
where it does not reproduce the model's own distribution (an architecture with an output
step llmrun does not apply), the intermediate layers are not shown and a note says why.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmrun.backends.base import Logits
from llmrun.backends.trace import Geometry, Looks, Trace, attention_layers, top_k

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from llmrun.backends.base import LoadedModel

    F32 = npt.NDArray[np.float32]

LENS_AGREEMENT = 0.05  # the largest gap between the lens's last layer and the model's own top probability


@dataclass(frozen=True, slots=True)
class Token:
    position: int
    id: int
    text: str
    norm: float  # the length of its embedding vector (the row of the embedding matrix)


@dataclass(frozen=True, slots=True)
class Neighbour:
    id: int
    text: str
    cosine: float


@dataclass(slots=True)
class Look:
    model: str
    tokens: list[Token]
    geometry: Geometry
    attention: dict[int, F32]  # layer → (heads, queries, keys)
    lens_ids: npt.NDArray[np.int64]  # (layers, positions, k); the last layer is the model's own distribution
    lens_probs: F32
    lens_shown: bool  # False: only the last layer (the model's own) is shown
    neighbours: dict[int, list[Neighbour]] = field(default_factory=dict)  # token id → its nearest tokens
    own_known: npt.NDArray[np.bool_] | None = None  # positions whose last-layer cell is the model's own (None: all)
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def piece_text(model: LoadedModel, token_id: int) -> str:
    return model.token_bytes(token_id, special=True).decode("utf-8", "replace")


def positions_line(geometry: Geometry) -> str:
    """How positions enter the model, in words."""
    if not geometry.rope:
        return (
            "Positions do not enter by rotation here: the model adds a learned position vector to each embedding "
            "or biases attention by distance."
        )
    window = (
        f" Some layers attend only to the last {geometry.sliding_window} tokens (a sliding window)."
        if geometry.sliding_window
        else ""
    )
    return (
        f"Positions enter through RoPE ({geometry.rope}, base {geometry.rope_base:,.0f}): no position vector is "
        "added to the embeddings; instead every query and key is rotated by an angle proportional to its "
        "position, so a query·key score depends on how far apart two tokens are, not on where they are." + window
    )


def look(
    model: LoadedModel,
    name: str,
    ids: Sequence[int],
    *,
    layers: Sequence[int] | None = None,
    top: int = 3,
    neighbours_of: Sequence[int] = (),
    neighbours: int = 8,
) -> Look:
    """One captured forward pass over ``ids`` and everything ``look`` shows of it."""
    import numpy as np

    from llmrun.backends.trace import looking

    seeing = looking(model)
    geometry = seeing.geometry()
    chosen = attention_layers(layers, geometry, len(ids))
    trace = seeing.trace(ids, chosen, top)
    started = time.perf_counter()
    n = len(ids)
    if trace.complete:
        lens = seeing.lens(trace.hidden.reshape(-1, geometry.n_embd), top)
        lens_ids = lens.ids.reshape(geometry.n_layer, n, top)
        lens_probs = lens.probs.reshape(geometry.n_layer, n, top)
    else:  # only the model's own distribution can be shown
        lens_ids = np.zeros((geometry.n_layer, n, top), dtype=np.int64)
        lens_probs = np.zeros((geometry.n_layer, n, top), dtype=np.float32)
    own_ids, own_probs, known = _own(model, trace, lens_ids[-1], lens_probs[-1], top)
    gap = float(np.abs(lens_probs[-1, known, 0] - own_probs[known, 0]).max(initial=0.0))
    agree = float(_agreeing(lens_ids[-1], own_ids, own_probs)[known].mean()) if known.any() else 1.0
    shown = trace.complete and gap <= LENS_AGREEMENT and agree >= 0.9
    notes = list(trace.notes)
    if trace.complete and not shown:
        notes.append(
            f"the logit lens of the layers before the last is not shown: applying the final norm and output head "
            f"to the last layer does not reproduce this {geometry.architecture} model's own distribution "
            f"(top-1 agrees at {agree:.0%} of the positions checked, probabilities differ by up to {gap:.2f})"
        )
    lens_ids[-1], lens_probs[-1] = own_ids, own_probs
    lens_seconds = time.perf_counter() - started
    started = time.perf_counter()
    norms, near = _embeddings(seeing, ids, neighbours_of, neighbours, model)
    tokens = [Token(i, token_id, piece_text(model, token_id), norms[i]) for i, token_id in enumerate(ids)]
    return Look(
        name,
        tokens,
        geometry,
        trace.attention,
        lens_ids,
        lens_probs,
        shown,
        near,
        known,
        {"capture": trace.seconds, "lens": lens_seconds, "embeddings": time.perf_counter() - started},
        notes,
    )


def _agreeing(lens_ids: npt.NDArray[np.int64], own_ids: npt.NDArray[np.int64], own_probs: F32) -> npt.NDArray[np.bool_]:
    """Where the lens's top token is the model's own choice: its top token, or at a near-tie (the model's
    top two within :data:`LENS_AGREEMENT`, the check's resolution) its second, which rounding can swap."""
    same: npt.NDArray[np.bool_] = lens_ids[:, 0] == own_ids[:, 0]
    if own_ids.shape[1] < 2:
        return same
    tied = own_probs[:, 0] - own_probs[:, 1] <= LENS_AGREEMENT
    agreeing: npt.NDArray[np.bool_] = same | (tied & (lens_ids[:, 0] == own_ids[:, 1]))
    return agreeing


def _own(
    model: LoadedModel, trace: Trace, lens_ids: npt.NDArray[np.int64], lens_probs: F32, top: int
) -> tuple[npt.NDArray[np.int64], F32, npt.NDArray[np.bool_]]:
    """The model's own next-token distribution after each position, and where it is known: from the
    captured pass where it ran the output head (MLX), else from a plain pass over every position (llama.cpp's
    capture stops before the head); at the last position always the pass ``llmrun next`` makes. Where it
    is not known (a backend without logits), the lens of the last layer stands for it."""
    import numpy as np

    known = np.full(len(trace.ids), trace.final is not None or isinstance(model, Logits))
    if trace.final is not None:
        own_ids, own_probs = trace.final.ids.copy(), trace.final.probs.copy()
    elif isinstance(model, Logits):
        rows = [top_k(chunk, top) for chunk in model.position_logits(trace.ids)]
        own_ids, own_probs = np.concatenate([r.ids for r in rows]), np.concatenate([r.probs for r in rows])
    else:
        own_ids, own_probs = lens_ids.copy(), lens_probs.copy()
    if isinstance(model, Logits):
        last = top_k(model.logits(trace.ids)[None, :], top)
        own_ids[-1], own_probs[-1] = last.ids[0], last.probs[0]
    return own_ids, own_probs, known


def _embeddings(
    seeing: Looks, ids: Sequence[int], queries: Sequence[int], k: int, model: LoadedModel
) -> tuple[list[float], dict[int, list[Neighbour]]]:
    """Each prompt token's embedding norm and, for each query token, its ``k`` nearest tokens by cosine
    (control tokens left out): the prompt's rows alone, and one pass over the embedding matrix with neighbours."""
    import numpy as np

    norms = [float(n) for n in np.linalg.norm(seeing.embedding(ids), axis=1)]
    if not queries:
        return norms, {}
    wanted = seeing.embedding(queries)
    targets = wanted / np.maximum(np.linalg.norm(wanted, axis=1, keepdims=True), 1e-12)
    scores: list[F32] = []
    for _, chunk in seeing.embedding_rows():
        lengths = np.maximum(np.linalg.norm(chunk, axis=1), 1e-12)
        scores.append((chunk @ targets.T / lengths[:, None]).T.astype(np.float32))
    cosine = np.concatenate(scores, axis=1)
    found: dict[int, list[Neighbour]] = {}
    for row, query in enumerate(queries):
        order = np.argsort(-cosine[row], kind="stable")
        near: list[Neighbour] = []
        for token_id in order[: 20 * k]:
            if int(token_id) == query or model.token_kind(int(token_id)) == "control":
                continue
            near.append(Neighbour(int(token_id), piece_text(model, int(token_id)), float(cosine[row, token_id])))
            if len(near) == k:
                break
        found[query] = near
    return norms, found
