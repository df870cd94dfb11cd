"""Memory plan arithmetic: what a model needs before it is loaded (pure).

Weights are the tensors' bytes as stored. The KV cache holds, for every layer, a
key and a value vector per KV head per token:

    KV bytes = layers × KV heads × (head dim K + head dim V) × context × bytes per element

(the "2 ×" of the textbook formula when K and V dims are equal). Sliding-window
layers (Gemma 2/3, Cohere 2) only need their window, but llama.cpp keeps them
full-size by default (``swa_full``), so the plan does too and shows both.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from llmrun.formats.gguf_header import GgufHeader

DEFAULT_MAX_CONTEXT = 4096
"""The default context: the model's trained length, capped here (never silently the full length)."""

KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "f32": 4.0}
RUNTIME_BYTES = 64 * 1024 * 1024
"""Runtime and allocator slack, on top of weights, KV cache and compute buffers."""
N_BATCH = 512
"""llama.cpp's default batch: its compute buffer holds logits for a whole batch."""
SWA_PATTERN = {"gemma3": 6, "gemma2": 2, "cohere2": 4}
"""Every n-th layer attends globally, the rest use the sliding window (llama.cpp's hparams)."""


@dataclass(frozen=True, slots=True)
class Geometry:
    """The shape facts of a model that decide its KV cache size."""

    n_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    context_train: int
    n_vocab: int = 0
    sliding_window: int = 0  # 0: none
    n_swa_layers: int = 0  # layers that use the sliding window


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    weight_bytes: int
    kv_bytes: int
    overhead_bytes: int
    n_ctx: int
    kv_type: str = "f16"

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.overhead_bytes


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return int(max(value))  # per-layer values: plan for the largest
    return None


def swa_layer_count(architecture: str, n_layers: int, pattern: int | None = None) -> int:
    """Sliding-window layers: all but every ``pattern``-th (the last of each group is global)."""
    pattern = pattern or SWA_PATTERN.get(architecture, 0)
    if pattern <= 1:
        return 0
    return n_layers - n_layers // pattern  # counted, not enumerated: a header may claim billions of layers


def geometry(header: GgufHeader) -> Geometry | None:
    """The model's geometry from its metadata, or None when the metadata lacks it."""
    n_layers = _positive_int(header.arch_value("block_count"))
    n_embd = _positive_int(header.arch_value("embedding_length"))
    n_head = _positive_int(header.arch_value("attention.head_count"))
    if n_layers is None or n_embd is None or n_head is None:
        return None
    n_kv = _positive_int(header.arch_value("attention.head_count_kv")) or n_head
    head_k = _positive_int(header.arch_value("attention.key_length")) or n_embd // n_head
    head_v = _positive_int(header.arch_value("attention.value_length")) or n_embd // n_head
    context = _positive_int(header.arch_value("context_length")) or DEFAULT_MAX_CONTEXT
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    n_vocab = getattr(tokens, "length", len(tokens) if isinstance(tokens, list) else 0)
    window = _positive_int(header.arch_value("attention.sliding_window")) or 0
    pattern = _positive_int(header.arch_value("attention.sliding_window_pattern"))
    n_swa = swa_layer_count(header.architecture, n_layers, pattern) if window else 0
    return Geometry(n_layers, n_kv, head_k, head_v, context, n_vocab, window, n_swa)


def default_context(geom: Geometry | None) -> int:
    """The smaller of the trained length and :data:`DEFAULT_MAX_CONTEXT`."""
    if geom is None:
        return DEFAULT_MAX_CONTEXT
    return min(geom.context_train, DEFAULT_MAX_CONTEXT)


def kv_cache_bytes(geom: Geometry, n_ctx: int, kv_type: str = "f16", *, swa_full: bool = True) -> int:
    """K and V for every layer: layers × KV heads × (head_dim_k + head_dim_v) × cells × bytes.

    With ``swa_full=False`` sliding-window layers hold only their window plus a batch
    (rounded up to 256 cells, as llama.cpp sizes them).
    """
    per_cell = geom.n_kv_heads * (geom.head_dim_k + geom.head_dim_v) * KV_BYTES_PER_ELEMENT[kv_type]
    full_layers = geom.n_layers if swa_full else geom.n_layers - geom.n_swa_layers
    cells = full_layers * n_ctx
    if not swa_full and geom.n_swa_layers:
        window_cells = min(n_ctx, -(-(geom.sliding_window + N_BATCH) // 256) * 256)
        cells += geom.n_swa_layers * window_cells
    return int(per_cell * cells)


def overhead_bytes(geom: Geometry | None, n_ctx: int) -> int:
    """Compute buffers (dominated by a batch of float32 logits) plus runtime slack."""
    n_vocab = geom.n_vocab if geom else 0
    return RUNTIME_BYTES + n_vocab * min(n_ctx, N_BATCH) * 4


def plan(header: GgufHeader, n_ctx: int, kv_type: str = "f16") -> MemoryPlan:
    geom = geometry(header)
    kv = kv_cache_bytes(geom, n_ctx, kv_type) if geom else 0
    return MemoryPlan(header.weight_bytes, kv, overhead_bytes(geom, n_ctx), n_ctx, kv_type)


def fits(memory_plan: MemoryPlan, available_bytes: int) -> bool:
    return memory_plan.total_bytes <= available_bytes


def largest_context(header: GgufHeader, available_bytes: int, kv_type: str = "f16") -> int:
    """The largest context (up to the trained length) whose plan fits; 0 when none does."""
    geom = geometry(header)
    limit = geom.context_train if geom else DEFAULT_MAX_CONTEXT
    low, high = 0, limit
    while low < high:  # the plan grows with the context: binary search
        middle = (low + high + 1) // 2
        if fits(plan(header, middle, kv_type), available_bytes):
            low = middle
        else:
            high = middle - 1
    return low


def parameter_count(header: GgufHeader) -> int:
    total = 0
    for tensor in header.tensors:
        count = 1
        for dim in tensor.shape:
            count *= dim
        total += count
    return total


def weights_by_type(header: GgufHeader) -> dict[str, tuple[int, int]]:
    """Tensor type name → (tensor count, bytes), largest first."""
    table: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tensor in header.tensors:
        entry = table[tensor.type_name]
        entry[0] += 1
        entry[1] += tensor.nbytes
    return {name: (c, b) for name, (c, b) in sorted(table.items(), key=lambda item: -item[1][1])}
