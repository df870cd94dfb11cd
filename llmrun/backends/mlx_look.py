"""Looking inside mlx-lm's forward pass, without rewriting the model's own loop.

mlx-lm's attention modules call ``scaled_dot_product_attention`` by its module-level
name (imported from ``mlx_lm.models.base``), which runs MLX's fused kernel and never
forms the weights. For one pass, that name in the model's module is replaced by the
same computation written out — softmax(scale · q·kᵀ + mask) · v, K/V heads shared
across query heads — that keeps the weights; the model's layer list is replaced by
wrappers that keep each layer's output. Both are put back afterwards, whatever happens.
The pass runs without a KV cache over the whole prompt, so the mask is causal (and
windowed on sliding-window layers, as the model builds it).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from llmrun.backends.trace import Geometry, TopK, TopKAccumulator, Trace, check_window
from llmrun.errors import BackendError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    F32 = npt.NDArray[np.float32]

ATTENTION = "scaled_dot_product_attention"


class MlxModel(Protocol):
    """What a capture reads of a loaded MLX model (:class:`~llmrun.backends.mlx.MlxModel`)."""

    model: Any  # mlx-lm's Model
    config: dict[str, Any]


def _parts(model: MlxModel) -> tuple[Any, list[Any], Any, Any]:
    """The inner model, its layers, its final norm and its output head (a callable on hidden rows)."""
    outer = model.model
    inner = getattr(outer, "model", None)
    layers = getattr(inner, "layers", None)
    norm = getattr(inner, "norm", None)
    embed = getattr(inner, "embed_tokens", None)
    if inner is None or not isinstance(layers, list) or norm is None or embed is None:
        raise BackendError(
            f"mlx-lm's {type(outer).__module__} is not laid out as look reads a model "
            "(model.layers, model.norm, model.embed_tokens)",
            "look at the GGUF form of this model",
        )
    head = outer.lm_head if "lm_head" in outer else embed.as_linear
    return inner, layers, norm, head


def geometry(model: MlxModel) -> Geometry:
    config = model.config
    text = config.get("text_config") or config
    n_head = int(text.get("num_attention_heads", 0))
    return Geometry(
        architecture=str(text.get("model_type", config.get("model_type", "?"))),
        n_layer=int(text.get("num_hidden_layers", 0)),
        n_head=n_head,
        n_head_kv=int(text.get("num_key_value_heads") or n_head),
        n_embd=int(text.get("hidden_size", 0)),
        n_vocab=int(text.get("vocab_size", 0)),
        sliding_window=int(text.get("sliding_window") or 0),
        rope="neox" if text.get("rope_theta") is not None else "",  # mlx-lm's nn.RoPE(traditional=False)
        rope_base=float(text.get("rope_theta") or 10_000.0),
    )


def _explicit_attention(kept: list[Any]) -> Any:
    """``scaled_dot_product_attention`` written out, keeping its weights in ``kept``."""
    import mlx.core as mx

    def attention(queries: Any, keys: Any, values: Any, cache: Any, scale: float, mask: Any, sinks: Any = None) -> Any:
        if sinks is not None or hasattr(cache, "bits"):
            raise BackendError("this model's attention uses sinks or a quantized cache", "look cannot show it yet")
        n_head, n_kv = queries.shape[1], keys.shape[1]
        if n_head != n_kv:  # grouped-query attention: K/V head j serves query heads j·g … j·g + g − 1
            keys = mx.repeat(keys, n_head // n_kv, axis=1)
            values = mx.repeat(values, n_head // n_kv, axis=1)
        scores = (queries.astype(mx.float32) * scale) @ keys.astype(mx.float32).swapaxes(-1, -2)
        n_q, n_k = scores.shape[-2], scores.shape[-1]
        if isinstance(mask, str) and mask == "causal":
            rows = mx.arange(n_k - n_q, n_k)[:, None]
            mask = rows >= mx.arange(n_k)[None, :]
        if mask is not None:
            if mask.dtype == mx.bool_:
                scores = mx.where(mask, scores, mx.array(-mx.inf, mx.float32))
            else:
                scores = scores + mask.astype(mx.float32)
        weights = mx.softmax(scores, axis=-1)
        kept.append(weights)
        return (weights @ values.astype(mx.float32)).astype(queries.dtype)

    return attention


class _Kept:
    """A layer that keeps its output."""

    def __init__(self, layer: Any, outputs: list[Any]) -> None:
        self.layer = layer
        self.outputs = outputs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.layer(*args, **kwargs)
        self.outputs.append(out[0] if isinstance(out, tuple) else out)
        return out


def trace(model: MlxModel, ids: Sequence[int], layers: Sequence[int], top: int) -> Trace:
    import mlx.core as mx
    import numpy as np

    geom = geometry(model)
    n = len(ids)
    check_window(geom, n)
    inner, blocks, _, _ = _parts(model)
    attention_module = type(getattr(blocks[0], "self_attn", blocks[0])).__module__
    module = sys.modules[attention_module]
    names = vars(module)  # the model's module: its attention calls the helper by this module-level name
    original = names.get(ATTENTION)
    if original is None:
        raise BackendError(f"{attention_module} calls no scaled_dot_product_attention", "look cannot show it")
    weights: list[Any] = []
    outputs: list[Any] = []
    started = time.perf_counter()
    names[ATTENTION] = _explicit_attention(weights)
    inner.layers = [_Kept(layer, outputs) for layer in blocks]
    try:
        logits = model.model(mx.array(list(ids))[None])
        mx.eval(logits, *weights, *outputs)
    finally:
        names[ATTENTION] = original
        inner.layers = blocks
    if len(weights) != geom.n_layer or len(outputs) != geom.n_layer:
        raise BackendError(
            f"captured {len(weights)} attention maps and {len(outputs)} layer outputs for {geom.n_layer} layers",
            "look cannot follow this model's layers",
        )
    final = TopKAccumulator(n, top)
    final.add(0, np.array(logits[0].astype(mx.float32)))
    hidden = np.stack([np.array(out[0].astype(mx.float32)) for out in outputs]).astype(np.float32)
    attention = {layer: np.array(weights[layer][0].astype(mx.float32), dtype=np.float32) for layer in layers}
    return Trace(tuple(ids), geom, attention, hidden, final.result(), time.perf_counter() - started)


def lens(model: MlxModel, hidden: F32, top: int, rows: int = 64) -> TopK:
    """The model's own final norm and output head (quantized as it is stored) on residual rows."""
    import mlx.core as mx
    import numpy as np

    _, _, norm, head = _parts(model)
    dtype = norm.weight.dtype  # the dtype the layers computed in: their outputs round-trip through float32
    parts: list[TopK] = []
    for start in range(0, hidden.shape[0], rows):
        x = mx.array(hidden[start : start + rows]).astype(dtype)
        part = TopKAccumulator(x.shape[0], top)
        part.add(0, np.array(head(norm(x)).astype(mx.float32)))
        parts.append(part.result())
    return TopK(np.concatenate([p.ids for p in parts]), np.concatenate([p.probs for p in parts]))


def embedding(model: MlxModel, ids: Sequence[int]) -> F32:
    import mlx.core as mx
    import numpy as np

    rows = _parts(model)[0].embed_tokens(mx.array(list(ids)))
    return np.array(rows.astype(mx.float32), dtype=np.float32)


def embedding_rows(model: MlxModel, chunk: int = 16384) -> Iterator[tuple[int, F32]]:
    import mlx.core as mx
    import numpy as np

    embed = _parts(model)[0].embed_tokens
    total = geometry(model).n_vocab
    for start in range(0, total, chunk):
        rows = embed(mx.arange(start, min(total, start + chunk)))
        yield start, np.array(rows.astype(mx.float32), dtype=np.float32)
