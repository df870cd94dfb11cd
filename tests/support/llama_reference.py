"""A Llama-architecture GGUF (SmolLM2) evaluated in float64 by numpy: attention weights and layer outputs.

The second reference beside :mod:`tests.support.gemma_reference`, for a model with grouped-query attention
over several K/V heads (SmolLM2-135M: 9 query heads reading 3 K/V heads), so that the head → K/V head
mapping is checked. It follows llama.cpp's graph for ``llama`` (``src/models/llama.cpp``): per layer RMS
norm → Q/K/V → RoPE on adjacent pairs (``LLAMA_ROPE_TYPE_NORM``: the converter permuted Q and K for it) →
causal attention, query head h reading K/V head h // (heads / K/V heads) → output projection + residual →
RMS norm → SiLU-gated feed-forward + residual; a final norm and the tied embedding as output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


class LlamaReference:
    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader
        from gguf.quants import dequantize

        reader = GGUFReader(path)
        meta = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.")}
        if meta["general.architecture"] != "llama":
            raise ValueError(f"{path} is not a Llama GGUF")
        self.n_layer = int(meta["llama.block_count"])
        self.n_head = int(meta["llama.attention.head_count"])
        self.n_head_kv = int(meta["llama.attention.head_count_kv"])
        self.head_dim = int(meta["llama.embedding_length"]) // self.n_head
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        self.rope_base = float(meta["llama.rope.freq_base"])
        self.weights: dict[str, F64] = {}
        for tensor in reader.tensors:
            shape = tuple(int(d) for d in reversed(tensor.shape))
            values = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            self.weights[tensor.name] = np.asarray(values, dtype=np.float64)

    def _norm(self, x: F64, weight: F64) -> F64:
        result: F64 = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight
        return result

    def _rope(self, x: F64) -> F64:
        """Rotation of adjacent pairs (2i, 2i + 1) of (positions, heads, head_dim)."""
        half = self.head_dim // 2
        inv_freq = self.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / self.head_dim)
        angles = np.arange(x.shape[0], dtype=np.float64)[:, None] * inv_freq[None, :]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = odd * cos + even * sin
        return out

    def kv_head(self, head: int) -> int:
        """The K/V head a query head reads (llama.cpp's broadcast: consecutive query heads share one)."""
        return head // (self.n_head // self.n_head_kv)

    def trace(self, ids: Sequence[int], kv_head: Callable[[int], int] | None = None) -> tuple[F64, F64]:
        """Attention weights (layers, heads, queries, keys) and layer outputs (layers, positions, n_embd);
        ``kv_head``: another head → K/V head mapping (a test shows a wrong one is told apart)."""
        w = self.weights
        n = len(ids)
        x = w["token_embd.weight"][np.asarray(ids)]
        reads = kv_head or self.kv_head
        masked = np.triu(np.ones((n, n), dtype=bool), 1)
        attention, hidden = [], []
        for layer in range(self.n_layer):
            p = f"blk.{layer}."
            h = self._norm(x, w[p + "attn_norm.weight"])
            q = self._rope((h @ w[p + "attn_q.weight"].T).reshape(n, self.n_head, self.head_dim))
            k = self._rope((h @ w[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, self.head_dim))
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, self.head_dim)
            weights = np.empty((self.n_head, n, n))
            out = np.empty((n, self.n_head, self.head_dim))
            for head in range(self.n_head):
                scores = q[:, head] @ k[:, reads(head)].T / math.sqrt(self.head_dim)
                scores[masked] = -np.inf
                scores = np.exp(scores - scores.max(axis=1, keepdims=True))
                weights[head] = scores / scores.sum(axis=1, keepdims=True)
                out[:, head] = weights[head] @ v[:, reads(head)]
            x = x + out.reshape(n, -1) @ w[p + "attn_output.weight"].T
            h = self._norm(x, w[p + "ffn_norm.weight"])
            gate = h @ w[p + "ffn_gate.weight"].T
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            attention.append(weights)
            hidden.append(x)
        return np.stack(attention), np.stack(hidden)
