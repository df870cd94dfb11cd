"""Sampling parameters and the reference sampling filters.

:class:`SamplingParams` is the one place the sampling fields, their defaults and
their valid ranges live. Every entry point (flags, ``models.toml``, chat ``/set``)
builds one through :func:`merge_layers`, which also records where each value came
from for ``--show-params``.

The filter functions below are the reference implementation of what each
parameter does to a next-token distribution (numpy, imported lazily so that the
CLI starts fast). They are pure and are tested on hand-built distributions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from llmrun.errors import InvalidParameter

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

MAX_SEED = 2**32 - 2  # llama.cpp reserves 0xFFFFFFFF for "random"


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameter(name, value, "a number")
    if not math.isfinite(value):
        raise InvalidParameter(name, value, "a finite number")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(name, value, "an integer")
    return value


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the next token is chosen, and when generation stops."""

    temperature: float = 0.8
    """Divides the logits; 0 means greedy (always the most likely token)."""
    top_k: int = 40
    """Keep only the k most likely tokens; 0 disables."""
    top_p: float = 0.95
    """Keep the smallest set of tokens whose probability sums to at least p; 1 disables."""
    min_p: float = 0.05
    """Drop tokens less likely than min_p times the most likely one; 0 disables."""
    repeat_penalty: float = 1.0
    """Divide the logits of recently seen tokens by this; 1 disables."""
    repeat_last_n: int = 64
    """How many recent tokens the penalties look at; 0 disables, -1 means the whole context."""
    presence_penalty: float = 0.0
    """Subtract this from the logit of every token already seen; 0 disables."""
    frequency_penalty: float = 0.0
    """Subtract this times the count of each token already seen; 0 disables."""
    seed: int | None = None
    """Random seed for reproducible sampling; None picks a fresh one each run."""
    max_tokens: int = 512
    """Most tokens to generate; -1 means until end of text or the context is full."""
    stop: tuple[str, ...] = field(default=())
    """Stop as soon as the output contains one of these strings (not included in the answer)."""

    def __post_init__(self) -> None:
        temperature = _number("temperature", self.temperature)
        if temperature < 0:
            raise InvalidParameter("temperature", self.temperature, ">= 0 (0 means greedy)")
        top_k = _integer("top_k", self.top_k)
        if top_k < 0:
            raise InvalidParameter("top_k", self.top_k, ">= 0 (0 disables top-k)")
        top_p = _number("top_p", self.top_p)
        if not 0 < top_p <= 1:
            raise InvalidParameter("top_p", self.top_p, "in (0, 1] (1 disables top-p)")
        min_p = _number("min_p", self.min_p)
        if not 0 <= min_p <= 1:
            raise InvalidParameter("min_p", self.min_p, "in [0, 1] (0 disables min-p)")
        repeat_penalty = _number("repeat_penalty", self.repeat_penalty)
        if repeat_penalty <= 0:
            raise InvalidParameter("repeat_penalty", self.repeat_penalty, "> 0 (1 disables it)")
        if _integer("repeat_last_n", self.repeat_last_n) < -1:
            raise InvalidParameter("repeat_last_n", self.repeat_last_n, ">= -1 (-1 = whole context, 0 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = _number(name, getattr(self, name))
            if not -2 <= value <= 2:
                raise InvalidParameter(name, getattr(self, name), "in [-2, 2] (0 disables it)")
        if self.seed is not None:
            seed = _integer("seed", self.seed)
            if not 0 <= seed <= MAX_SEED:
                raise InvalidParameter("seed", self.seed, f"in [0, {MAX_SEED}]")
        max_tokens = _integer("max_tokens", self.max_tokens)
        if max_tokens < 1 and max_tokens != -1:
            raise InvalidParameter("max_tokens", self.max_tokens, ">= 1, or -1 for no limit")
        stop = self.stop
        if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidParameter("stop", self.stop, "a list of non-empty strings")
        # Normalise exact types so equal parameters compare and hash equal.
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "min_p", min_p)
        object.__setattr__(self, "repeat_penalty", repeat_penalty)
        object.__setattr__(self, "presence_penalty", float(self.presence_penalty))
        object.__setattr__(self, "frequency_penalty", float(self.frequency_penalty))
        object.__setattr__(self, "stop", tuple(stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def run_seed(self) -> int | None:
        """The seed a run uses: None when greedy (no randomness), the given one, else a fresh
        one (reported with the run so it can be replayed)."""
        if self.greedy:
            return None
        if self.seed is not None:
            return self.seed
        import secrets

        return secrets.randbelow(MAX_SEED + 1)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}


DEFAULTS = SamplingParams()

T = TypeVar("T")

Layer = tuple[str, Mapping[str, Any]]
"""A named source of values, e.g. ``("command line", {"top_k": 1})``."""


def merge_layers(cls: type[T], layers: Sequence[Layer]) -> tuple[T, dict[str, str]]:
    """Build ``cls`` from layers of values, later layers winning.

    Returns the value and, for every field, the name of the layer that set it
    (``"default"`` when none did). ``None`` in a layer means "not given".
    Unknown keys are a programming error and raise ``TypeError``.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    names = [f.name for f in fields(cls)]
    values: dict[str, Any] = {}
    sources = dict.fromkeys(names, "default")
    for source, layer in layers:
        unknown = set(layer) - set(names)
        if unknown:
            raise TypeError(f"unknown fields {sorted(unknown)} in layer {source!r}")
        for name, value in layer.items():
            if value is not None:
                values[name] = tuple(value) if isinstance(value, list) else value
                sources[name] = source
    return cls(**values), sources


# --- reference filters ---------------------------------------------------------
# Each takes logits or probabilities as a 1-D float array and returns a new array;
# removed tokens get -inf logits / 0 probability.


def softmax(logits: FloatArray) -> FloatArray:
    import numpy as np

    finite = np.isfinite(logits)
    if not finite.any():
        raise ValueError("all logits are -inf")
    shifted = np.where(finite, logits - np.max(logits[finite]), -np.inf)
    exp = np.exp(shifted)
    result: FloatArray = exp / exp.sum()
    return result


def apply_penalties(
    logits: npt.NDArray[Any],
    previous: Sequence[int],
    params: SamplingParams,
) -> FloatArray:
    """Repetition (llama.cpp/CTRL style), presence and frequency penalties.

    ``previous`` are the token ids generated or in the prompt, oldest first;
    only the last ``repeat_last_n`` count (all when -1, none when 0).
    """
    import numpy as np

    out = np.array(logits, dtype=np.float64)
    if params.repeat_last_n == 0:
        return out
    window = previous if params.repeat_last_n == -1 else previous[-params.repeat_last_n :]
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    if ids.size == 0:
        return out
    seen = out[ids]
    seen = np.where(seen > 0, seen / params.repeat_penalty, seen * params.repeat_penalty)
    seen = seen - counts * params.frequency_penalty - params.presence_penalty
    out[ids] = seen
    return out


def apply_temperature(logits: FloatArray, temperature: float) -> FloatArray:
    """Scale logits by 1/T; T = 0 keeps only the arg-max (greedy)."""
    import numpy as np

    if temperature == 0:
        out = np.full_like(logits, -np.inf, dtype=np.float64)
        best = int(np.argmax(logits))
        out[best] = logits[best]
        return out
    result: FloatArray = np.asarray(logits, dtype=np.float64) / temperature
    return result


def top_k_filter(probs: FloatArray, k: int) -> FloatArray:
    """Zero all but the k most probable tokens (ties at the boundary kept by order)."""
    import numpy as np

    if k <= 0 or k >= probs.size:
        return np.array(probs, dtype=np.float64)
    keep = np.argsort(-probs, kind="stable")[:k]
    out = np.zeros_like(probs, dtype=np.float64)
    out[keep] = probs[keep]
    return out


def top_p_filter(probs: FloatArray, p: float) -> FloatArray:
    """Keep the smallest prefix (by descending probability) whose mass reaches p."""
    import numpy as np

    if p >= 1:
        return np.array(probs, dtype=np.float64)
    order = np.argsort(-probs, kind="stable")
    total = probs.sum()
    cumulative = np.cumsum(probs[order]) / total
    n_keep = int(np.searchsorted(cumulative, p, side="left")) + 1
    keep = order[: max(1, n_keep)]
    out = np.zeros_like(probs, dtype=np.float64)
    out[keep] = probs[keep]
    return out


def min_p_filter(probs: FloatArray, min_p: float) -> FloatArray:
    """Zero tokens whose probability is below min_p times the largest one."""
    import numpy as np

    if min_p <= 0:
        return np.array(probs, dtype=np.float64)
    threshold = min_p * probs.max()
    return np.where(probs >= threshold, probs, 0.0).astype(np.float64)


def log_softmax(logits: npt.NDArray[Any]) -> FloatArray:
    """Log-probabilities of the model's distribution (temperature 1)."""
    import numpy as np

    values = np.asarray(logits, dtype=np.float64)
    peak = np.max(values)
    result: FloatArray = values - (peak + np.log(np.sum(np.exp(values - peak))))
    return result


def top_indices(values: npt.NDArray[Any], n: int) -> list[int]:
    """Indices of the ``n`` largest values, largest first (ties by index)."""
    import numpy as np

    n = min(n, values.size)
    if n <= 0:
        return []
    part = np.argpartition(-values, n - 1)[:n]
    order = sorted(part.tolist(), key=lambda i: (-float(values[i]), i))
    return [int(i) for i in order]


def entropy_bits(probs: FloatArray) -> float:
    import numpy as np

    nonzero = probs[probs > 0]
    return float(-(nonzero * np.log2(nonzero)).sum())


def renormalize(probs: FloatArray) -> FloatArray:
    result: FloatArray = probs / probs.sum()
    return result


REMOVED_BY = ("", "top-k", "top-p", "min-p", "greedy")
"""Codes in :attr:`Stages.removed_by`: which step removed a token (0: kept)."""


@dataclass(frozen=True, slots=True)
class Stages:
    """What each sampling step does to one next-token distribution."""

    raw: FloatArray  # softmax of the model's logits (temperature 1, no penalties)
    tempered: FloatArray  # softmax of the penalised logits / temperature, before the filters
    removed_by: npt.NDArray[np.int8]  # index into REMOVED_BY for every token
    final: FloatArray  # the distribution generation samples from

    @property
    def survivors(self) -> int:
        return int((self.removed_by == 0).sum())


def sampling_stages(logits: npt.NDArray[Any], params: SamplingParams, previous: Sequence[int] = ()) -> Stages:
    """The distribution generation samples from, step by step, in llama.cpp's order:
    penalties → top-k → top-p → min-p → temperature → renormalise.

    Top-p and min-p see the probabilities of the tokens still in play (temperature 1),
    as in llama.cpp's sampler chain; temperature only reshapes the survivors.
    """
    import numpy as np

    raw = softmax(np.asarray(logits, dtype=np.float64))
    penalized = apply_penalties(logits, previous, params)
    removed = np.zeros(penalized.size, dtype=np.int8)
    if params.greedy:
        final = softmax(apply_temperature(penalized, 0))
        removed[final == 0] = REMOVED_BY.index("greedy")
        return Stages(raw, final, removed, final)
    tempered = softmax(penalized / params.temperature)
    probs = softmax(penalized)
    for code in (1, 2, 3):
        if code == 1:
            kept = top_k_filter(probs, params.top_k)
        elif code == 2:
            kept = top_p_filter(renormalize(probs), params.top_p)
        else:
            kept = min_p_filter(renormalize(probs), params.min_p)
        removed[(kept == 0) & (probs > 0)] = code
        probs = kept
    final = softmax(np.where(probs > 0, penalized / params.temperature, -np.inf))
    return Stages(raw, tempered, removed, final)


def filtered_distribution(logits: FloatArray, params: SamplingParams, previous: Sequence[int] = ()) -> FloatArray:
    """The distribution generation samples from (see :func:`sampling_stages`)."""
    return sampling_stages(logits, params, previous).final
