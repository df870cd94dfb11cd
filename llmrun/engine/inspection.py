"""What the model predicts next, and what each sampling step does to it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmrun.decoding.sampling import REMOVED_BY, SamplingParams, entropy_bits, sampling_stages, top_indices

if TYPE_CHECKING:
    from llmrun.backends.base import LoadedModel


@dataclass(frozen=True, slots=True)
class Candidate:
    rank: int
    id: int
    piece: bytes
    raw: float  # the model's probability (temperature 1)
    tempered: float  # after penalties and temperature, before the filters
    final: float  # after top-k, top-p, min-p and renormalisation: what sampling uses
    removed_by: str  # "" when the token survives


@dataclass(frozen=True, slots=True)
class NextToken:
    prompt_tokens: int
    vocabulary: int
    candidates: tuple[Candidate, ...]
    raw_entropy: float  # bits
    final_entropy: float
    survivors: int


def next_token(model: LoadedModel, ids: Sequence[int], params: SamplingParams, top: int) -> NextToken:
    """One forward pass over ``ids`` and the top ``top`` candidates at every stage.

    Penalties see no previous tokens: in generation they apply to the tokens
    generated so far, and before the first there are none.
    """
    from llmrun.backends.base import with_logits

    stages = sampling_stages(with_logits(model, "show next-token logits").logits(ids), params)
    rows = tuple(
        Candidate(
            rank,
            i,
            model.token_bytes(i, special=True),
            float(stages.raw[i]),
            float(stages.tempered[i]),
            float(stages.final[i]),
            REMOVED_BY[int(stages.removed_by[i])],
        )
        for rank, i in enumerate(top_indices(stages.raw, top), start=1)
    )
    return NextToken(
        len(ids),
        int(stages.raw.size),
        rows,
        entropy_bits(stages.raw),
        entropy_bits(stages.final),
        stages.survivors,
    )
