"""What the MLX backend's single stream and its batch decoder share: the sampler, the logits processors,
and the model as the batch decoder sees it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from llmrun.decoding.sampling import SamplingParams

if TYPE_CHECKING:
    from llmrun.structured.grammar import Constraint


PREFILL_STEP = 512


def make_sampler(params: SamplingParams, vocab_size: int, *, seed: int | None = None) -> Callable[[Any], Any]:
    """log-probabilities → token: top-k → top-p → min-p → temperature → draw (greedy at t=0).

    With ``seed`` the draws come from the sampler's own key, not mlx's global random state, so a
    sequence's answer does not depend on what else is sampled (continuous batching)."""
    import mlx.core as mx
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, categorical_sampling

    if params.greedy:
        return lambda logprobs: mx.argmax(logprobs, axis=-1)
    filters: list[Callable[[Any], Any]] = []
    if 0 < params.top_k < vocab_size:
        filters.append(lambda x: apply_top_k(x, params.top_k))
    if 0 < params.top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, params.top_p))
    if params.min_p > 0:
        filters.append(lambda x: apply_min_p(x, params.min_p))

    key = [mx.random.key(seed)] if seed is not None else None

    def sample(logprobs: Any) -> Any:
        for apply in filters:
            logprobs = apply(logprobs)
        if key is None:
            return categorical_sampling(logprobs, params.temperature)
        key[0], draw = mx.random.split(key[0])
        return mx.random.categorical(logprobs * (1 / params.temperature), key=draw)

    return sample


def make_processors(
    params: SamplingParams, n_ctx: int, prompt_length: int, constraint: Constraint | None = None
) -> list[Callable[[Any, Any], Any]]:
    """Penalty processors over the generated tokens only, as the GGUF backend applies them; then the
    constraint's mask (mlx-lm calls processors once before each sampled token, with the tokens so far)."""
    masks: list[Callable[[Any, Any], Any]] = []
    if constraint is not None:

        def mask(tokens: Any, logits: Any) -> Any:
            constraint.follow(tokens)
            return constraint.mask_mlx(logits)

        masks.append(mask)
    return _penalties(params, n_ctx, prompt_length) + masks


def _penalties(params: SamplingParams, n_ctx: int, prompt_length: int) -> list[Callable[[Any, Any], Any]]:
    from mlx_lm.sample_utils import make_logits_processors

    window = n_ctx if params.repeat_last_n == -1 else params.repeat_last_n
    if window == 0:
        return []
    processors = make_logits_processors(
        repetition_penalty=params.repeat_penalty if params.repeat_penalty != 1.0 else None,
        repetition_context_size=window,
        presence_penalty=params.presence_penalty or None,
        presence_context_size=window,
        frequency_penalty=params.frequency_penalty or None,
        frequency_context_size=window,
    )

    def generated_only(process: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        return lambda tokens, logits: process(tokens[prompt_length:], logits)

    return [generated_only(p) for p in processors]


class MlxSequenceModel(Protocol):
    """A loaded MLX model as the batch decoder sees it (:class:`~llmrun.backends.mlx.MlxModel`)."""

    @property
    def model(self) -> Any: ...  # the mlx-lm module

    @property
    def vocab_size(self) -> int: ...

    def token_bytes(self, token_id: int, *, special: bool = False) -> bytes: ...

    def is_end(self, token_id: int) -> bool: ...


def cache_to_bytes(cache: list[Any]) -> bytes:
    """mlx-lm's prompt cache as the bytes of its own file format (``save_prompt_cache``: safetensors
    with each layer's class and state; a quantized cache stays quantized)."""
    import tempfile
    from pathlib import Path

    from mlx_lm.models.cache import save_prompt_cache

    with tempfile.TemporaryDirectory(prefix="llmrun-kv-") as folder:
        path = Path(folder) / "cache.safetensors"
        save_prompt_cache(str(path), cache)
        return path.read_bytes()


def cache_from_bytes(payload: bytes | bytearray) -> list[Any] | None:
    """The prompt cache :func:`cache_to_bytes` wrote; None when mlx-lm cannot read it."""
    import tempfile
    from pathlib import Path

    import mlx.core as mx
    from mlx_lm.models.cache import load_prompt_cache

    with tempfile.TemporaryDirectory(prefix="llmrun-kv-") as folder:
        path = Path(folder) / "cache.safetensors"
        path.write_bytes(payload)
        try:
            cache: list[Any] = load_prompt_cache(str(path))  # type: ignore[no-untyped-call]
            mx.eval([layer.state for layer in cache])  # read now: the file goes with the folder
        except Exception:  # whatever mlx-lm raises on a file it cannot read
            return None
        return cache
