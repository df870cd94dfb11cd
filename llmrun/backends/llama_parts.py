"""What the GGUF backend's single stream, its batch decoder and its speculative loop share: llama.cpp's
sampler chain built from SamplingParams, sampling one row of logits (with a constraint's mask), and the
model as the decoders see it (:class:`LlamaModel`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from llmrun.backends.base import LoadParams
from llmrun.decoding.sampling import SamplingParams
from llmrun.decoding.speculative import Draft, Drafter

if TYPE_CHECKING:
    from llmrun.models.kv_store import KvStore
    from llmrun.structured.grammar import Constraint


class LlamaModel(Protocol):
    """A loaded GGUF model as its batch decoder and speculative loop see it
    (:class:`~llmrun.backends.gguf.GgufModel`)."""

    @property
    def llama(self) -> Any: ...  # llama_cpp.Llama

    @property
    def n_ctx(self) -> int: ...

    @property
    def load_params(self) -> LoadParams: ...

    @property
    def draft(self) -> Draft: ...

    @property
    def draft_model_drafter(self) -> Drafter | None: ...

    @property
    def kv_store(self) -> KvStore | None: ...

    def piece(self, token_id: int, special: bool = False) -> bytes: ...

    def is_end(self, token_id: int) -> bool: ...

    def close(self) -> None: ...


def sampler_kwargs(params: SamplingParams) -> dict[str, Any]:
    """``Llama.generate`` keyword arguments for ``params`` (the seed and window are set apart)."""
    return {
        "temp": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "repeat_penalty": params.repeat_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
    }


def sampler_chain(params: SamplingParams, seed: int, n_vocab: int, window: int) -> Any:
    """A llama.cpp sampler chain for ``params``, as ``Llama.generate`` builds it from
    :func:`sampler_kwargs` (penalties → greedy, or top-k → top-p → min-p → temperature → draw)."""
    from llama_cpp import _internals as internals

    chain = internals.LlamaSampler()
    chain.add_penalties(n_vocab, window, params.repeat_penalty, params.frequency_penalty, params.presence_penalty)
    if params.greedy:
        chain.add_greedy()
    else:
        chain.add_top_k(params.top_k)
        chain.add_top_p(params.top_p, 1)
        chain.add_min_p(params.min_p, 1)
        chain.add_temp(params.temperature)
        chain.add_dist(seed)
    return chain


def sample_row(ctx: Any, chain: Any, row: int, n_vocab: int, constraint: Constraint | None = None) -> int:
    """The token ``chain`` samples from the logits of batch row ``row`` of ``ctx``: under ``constraint``
    (which masks them first, in place, since llama.cpp's sampler reads them there, and then follows
    the token)."""
    if constraint is not None:
        import numpy as np

        constraint.mask(np.ctypeslib.as_array(ctx.get_logits_ith(row), shape=(n_vocab,)))
    token = int(chain.sample(ctx, row))
    if constraint is not None:
        constraint.accept(token)
    return token


def _masker(constraint: Constraint) -> Callable[[Any, Any], Any]:
    """A llama-cpp-python logits processor: called with the tokens so far before each sampled token."""

    def process(input_ids: Any, logits: Any) -> Any:
        constraint.follow(input_ids)
        constraint.mask(logits)
        return logits

    return process
