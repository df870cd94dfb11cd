"""How far one model's next-token predictions are from another's, teacher-forced over a text.

One implementation for every backend: both models see the same token ids and
report raw logits per position (:meth:`LoadedModel.position_logits`); from them
come perplexity of each, the mean KL divergence KL(reference ‖ candidate), and
the share of positions whose most likely token agrees.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmrun.sampling import log_softmax

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from llmrun.backends.base import LoadedModel


@dataclass(frozen=True, slots=True)
class Comparison:
    positions: int
    top1_agreement: float
    mean_kl: float
    perplexity_reference: float
    perplexity_candidate: float


def rows(chunks: Iterable[npt.NDArray[np.float32]]) -> Iterator[npt.NDArray[np.float32]]:
    for chunk in chunks:
        yield from chunk


def compare_rows(
    reference: Iterable[npt.NDArray[np.float32]], candidate: Iterable[npt.NDArray[np.float32]], ids: Sequence[int]
) -> Comparison:
    """Position i's logits predict ids[i + 1]; the last position predicts nothing and is skipped."""
    import numpy as np

    agree = 0
    kl_total = nll_ref = nll_cand = 0.0
    n = 0
    for position, (ref_row, cand_row) in enumerate(zip(reference, candidate, strict=False)):
        if position + 1 >= len(ids):
            break
        if ref_row.shape != cand_row.shape:
            raise ValueError(f"vocabularies differ: {ref_row.shape[-1]} vs {cand_row.shape[-1]} entries")
        log_p, log_q = log_softmax(ref_row), log_softmax(cand_row)
        target = ids[position + 1]
        agree += int(np.argmax(ref_row) == np.argmax(cand_row))
        kl_total += float(np.sum(np.exp(log_p) * (log_p - log_q)))
        nll_ref -= float(log_p[target])
        nll_cand -= float(log_q[target])
        n += 1
    if n == 0:
        raise ValueError("the text needs at least two tokens")
    return Comparison(n, agree / n, kl_total / n, math.exp(nll_ref / n), math.exp(nll_cand / n))


def compare(reference: LoadedModel, candidate: LoadedModel, ids: Sequence[int]) -> Comparison:
    return compare_rows(rows(reference.position_logits(ids)), rows(candidate.position_logits(ids)), ids)
