"""Memory plan arithmetic: what a model needs before it is loaded (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmrun.gguf_header import GgufHeader

DEFAULT_MAX_CONTEXT = 4096
"""The default context: the model's trained length, capped here (never silently the full length)."""

KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "f32": 4.0}
RUNTIME_BYTES = 64 * 1024 * 1024
"""Runtime and allocator slack, on top of weights, KV cache and compute buffers."""
N_BATCH = 512
"""llama.cpp's default batch: its compute buffer holds logits for a whole batch."""


@dataclass(frozen=True, slots=True)
class Geometry:
    """The shape facts of a model that decide its KV cache size."""

    n_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    context_train: int
    n_vocab: int = 0


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    weight_bytes: int
    kv_bytes: int
    overhead_bytes: int
    n_ctx: int

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
    return Geometry(n_layers, n_kv, head_k, head_v, context, n_vocab)


def default_context(geom: Geometry | None) -> int:
    """The smaller of the trained length and :data:`DEFAULT_MAX_CONTEXT`."""
    if geom is None:
        return DEFAULT_MAX_CONTEXT
    return min(geom.context_train, DEFAULT_MAX_CONTEXT)


def kv_cache_bytes(geom: Geometry, n_ctx: int, kv_type: str = "f16") -> int:
    """K and V for every layer: layers × KV heads × (head_dim_k + head_dim_v) × ctx × bytes."""
    per_token = geom.n_layers * geom.n_kv_heads * (geom.head_dim_k + geom.head_dim_v)
    return int(per_token * n_ctx * KV_BYTES_PER_ELEMENT[kv_type])


def overhead_bytes(geom: Geometry | None, n_ctx: int) -> int:
    """Compute buffers (dominated by a batch of float32 logits) plus runtime slack."""
    n_vocab = geom.n_vocab if geom else 0
    return RUNTIME_BYTES + n_vocab * min(n_ctx, N_BATCH) * 4


def plan(header: GgufHeader, n_ctx: int, kv_type: str = "f16") -> MemoryPlan:
    geom = geometry(header)
    kv = kv_cache_bytes(geom, n_ctx, kv_type) if geom else 0
    return MemoryPlan(header.weight_bytes, kv, overhead_bytes(geom, n_ctx), n_ctx)


def fits(memory_plan: MemoryPlan, available_bytes: int) -> bool:
    return memory_plan.total_bytes <= available_bytes


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
