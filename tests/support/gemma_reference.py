"""Gemma 3 evaluated in float64 by numpy from a GGUF's dequantized weights.

The reference the backends are compared against: it does not depend on the host's
SIMD kernels, build flags or thread count (llama.cpp's logits do: AVX2 vs AVX-512
kernels, weight repacking and threads change them by up to a few tenths of a logit,
because llama.cpp multiplies quantized weights against 8-bit-quantized activations).
Here every weight is exactly its dequantized value and every operation is float64,
so two machines agree to ~1e-9.

It follows llama.cpp's graph for the architecture (``src/models/gemma3.cpp``):
embedding × √d, then per layer RMS norm → Q/K/V → per-head RMS norm of Q and K →
NeoX RoPE (10k base on sliding-window layers, the file's base on every sixth, global
one) → Q scaled by 1/√head_dim → causal attention (K/V heads shared) → post-attention
norm + residual → RMS norm → GELU(tanh)-gated feed-forward → post-FFN norm + residual;
a final norm and the tied embedding as output. Full recomputation per call; meant for
a few hundred positions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
LOCAL_ROPE_BASE = 10_000.0  # llama.cpp's default for sliding-window layers; Gemma 3 GGUFs do not carry it
SWA_PATTERN = 6  # every sixth layer attends globally
META = "__metadata__"  # the kept file's entry for the GGUF's metadata (JSON)


def _kept(path: Path, cache: Path | None) -> Path | None:
    """Where the dequantized weights of ``path`` are kept between runs (gguf's numpy dequantization of
    the 270M model takes about 13 s; reading them back about 1 s): by the file's name, size and time."""
    if cache is None:
        return None
    stat = path.stat()
    return cache / f"{path.stem}-dequantized-{stat.st_size}-{stat.st_mtime_ns}.npz"


def _read(path: Path) -> tuple[dict[str, Any], dict[str, F64]]:
    """The file's metadata (its tokenizer's left out) and every tensor dequantized, in float64."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    meta = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.")}
    weights = {}
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        weights[tensor.name] = np.asarray(dequantize(tensor.data, tensor.tensor_type).reshape(shape), dtype=np.float64)
    return meta, weights


class GemmaReference:
    def __init__(self, path: Path, cache: Path | None = None) -> None:
        kept = _kept(path, cache)
        if kept is not None and kept.is_file():
            with np.load(kept) as stored:
                meta = json.loads(str(stored[META]))
                weights = {name: stored[name].astype(np.float64) for name in stored.files if name != META}
        else:
            meta, weights = _read(path)
            if kept is not None:  # gguf's dequantize computes in float32: kept as it computed them
                part = kept.with_name(kept.name + ".part")
                with part.open("wb") as out:
                    np.savez(
                        out,
                        **{META: np.array(json.dumps(meta))},
                        **{n: w.astype(np.float32) for n, w in weights.items()},
                    )
                part.replace(kept)
        if meta["general.architecture"] != "gemma3":
            raise ValueError(f"{path} is not a Gemma 3 GGUF")
        self.n_layer = int(meta["gemma3.block_count"])
        self.n_embd = int(meta["gemma3.embedding_length"])
        self.n_head = int(meta["gemma3.attention.head_count"])
        self.n_head_kv = int(meta["gemma3.attention.head_count_kv"])
        self.head_dim = int(meta["gemma3.attention.key_length"])
        self.eps = float(meta["gemma3.attention.layer_norm_rms_epsilon"])
        self.rope_base = float(meta["gemma3.rope.freq_base"])
        self.window = int(meta.get("gemma3.attention.sliding_window", 0))
        self.weights: dict[str, F64] = weights

    def _is_local(self, layer: int) -> bool:
        return self.window > 0 and layer % SWA_PATTERN < SWA_PATTERN - 1

    def _norm(self, x: F64, weight: F64) -> F64:
        result: F64 = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight
        return result

    def _rope(self, x: F64, base: float) -> F64:
        """NeoX rotation of (positions, heads, head_dim): dimension i pairs with i + head_dim/2."""
        half = self.head_dim // 2
        inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2 / self.head_dim)
        angles = np.arange(x.shape[0], dtype=np.float64)[:, None] * inv_freq[None, :]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        first, second = x[..., :half], x[..., half:]
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)

    def _attention(self, layer: int, h: F64, kept: list[F64] | None = None) -> F64:
        w = self.weights
        prefix = f"blk.{layer}."
        n = h.shape[0]
        q = (h @ w[prefix + "attn_q.weight"].T).reshape(n, self.n_head, self.head_dim)
        k = (h @ w[prefix + "attn_k.weight"].T).reshape(n, self.n_head_kv, self.head_dim)
        v = (h @ w[prefix + "attn_v.weight"].T).reshape(n, self.n_head_kv, self.head_dim)
        base = LOCAL_ROPE_BASE if self._is_local(layer) else self.rope_base
        q = self._rope(self._norm(q, w[prefix + "attn_q_norm.weight"]), base) / math.sqrt(self.head_dim)
        k = self._rope(self._norm(k, w[prefix + "attn_k_norm.weight"]), base)
        positions = np.arange(n)
        distance = positions[:, None] - positions[None, :]
        masked = distance < 0
        if self._is_local(layer):
            masked |= distance >= self.window
        group = self.n_head // self.n_head_kv
        out = np.empty_like(q)
        weights = np.empty((self.n_head, n, n))
        for head in range(self.n_head):
            scores = q[:, head, :] @ k[:, head // group, :].T
            scores[masked] = -np.inf
            scores = np.exp(scores - scores.max(axis=1, keepdims=True))
            weights[head] = scores / scores.sum(axis=1, keepdims=True)
            out[:, head, :] = weights[head] @ v[:, head // group, :]
        if kept is not None:
            kept.append(weights)
        result: F64 = out.reshape(n, -1) @ w[prefix + "attn_output.weight"].T
        return result

    def _feed_forward(self, layer: int, h: F64) -> F64:
        w = self.weights
        prefix = f"blk.{layer}."
        gate = h @ w[prefix + "ffn_gate.weight"].T
        gelu = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
        result: F64 = (gelu * (h @ w[prefix + "ffn_up.weight"].T)) @ w[prefix + "ffn_down.weight"].T
        return result

    def trace(self, ids: Sequence[int]) -> tuple[F64, F64]:
        """Every layer's attention weights (layers, heads, queries, keys) and every layer's output
        (layers, positions, n_embd), float64: what ``llmrun look`` captures, computed independently."""
        attention: list[F64] = []
        hidden: list[F64] = []
        self._layers(ids, attention, hidden)
        return np.stack(attention), np.stack(hidden)

    def lens(self, hidden: F64) -> F64:
        """The final norm and the output head on residual rows: logits (rows, vocabulary)."""
        w = self.weights
        result: F64 = self._norm(hidden, w["output_norm.weight"]) @ w.get("output.weight", w["token_embd.weight"]).T
        return result

    def _layers(self, ids: Sequence[int], attention: list[F64] | None = None, hidden: list[F64] | None = None) -> F64:
        w = self.weights
        x = w["token_embd.weight"][np.asarray(ids)] * math.sqrt(self.n_embd)
        for layer in range(self.n_layer):
            prefix = f"blk.{layer}."
            attn = self._attention(layer, self._norm(x, w[prefix + "attn_norm.weight"]), attention)
            x = x + self._norm(attn, w[prefix + "post_attention_norm.weight"])
            ffn = self._feed_forward(layer, self._norm(x, w[prefix + "ffn_norm.weight"]))
            x = x + self._norm(ffn, w[prefix + "post_ffw_norm.weight"])
            if hidden is not None:
                hidden.append(x)
        return x

    def logits(self, ids: Sequence[int], *, last: bool = False) -> F64:
        """Logits at every position of ``ids``: (len(ids), vocabulary), float64; with ``last``, at the last
        position only, (1, vocabulary) (the output projection over the whole vocabulary is most of the cost)."""
        x = self._layers(ids)
        return self.lens(x[-1:] if last else x)

    def greedy(self, prompt: Sequence[int], steps: int) -> tuple[list[int], list[float]]:
        """``steps`` greedy tokens after ``prompt`` and the margin (top-1 minus top-2 logit) of each choice."""
        ids, chosen, margins = list(prompt), [], []
        for _ in range(steps):
            row = self.logits(ids, last=True)[-1]
            top2 = np.argsort(row)[-2:][::-1]
            chosen.append(int(top2[0]))
            margins.append(float(row[top2[0]] - row[top2[1]]))
            ids.append(int(top2[0]))
        return chosen, margins


def top2_margin(row: Any) -> tuple[int, float]:
    """The arg-max of a logit row and its lead over the runner-up."""
    top2 = np.argsort(row)[-2:][::-1]
    return int(top2[0]), float(row[top2[0]] - row[top2[1]])
