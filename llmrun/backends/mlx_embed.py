"""Embeddings on MLX from a Hugging Face BERT-family directory (config.json, safetensors,
tokenizer.json), such as sentence-transformers' all-MiniLM-L6-v2.

mlx-lm has decoder models only, and the MLX embedding package (mlx-embeddings) pulls in a
vision/audio stack (mlx-vlm, OpenCV, pandas, pyarrow), so the encoder is written here with MLX's
own primitives — ``mx.fast.layer_norm`` and ``mx.fast.scaled_dot_product_attention`` — as the
textbook describes BERT: token + position + type embeddings, N × (self-attention, add & norm,
GELU feed-forward, add & norm), then the sentence-transformers pooling (mean or CLS) and L2
normalization. The tokenizer is the directory's own ``tokenizer.json`` through ``tokenizers``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.errors import ModelFileError, UsageError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

SPECIAL_TOKENS = 2  # [CLS] … [SEP]
BATCH = 32


def is_bert_dir(directory: Path) -> bool:
    from llmrun.formats.mlx_header import read_json

    config = directory / "config.json"
    if not (config.is_file() and (directory / "tokenizer.json").is_file()):
        return False
    value = read_json(config, "model config JSON")
    return isinstance(value, dict) and value.get("model_type") == "bert"


class MlxEmbedder:
    def __init__(self, directory: Path, config: dict[str, Any], weights: dict[str, Any], tokenizer: Any, pool: str):
        self.path = directory
        self._config = config
        self._w = weights
        self._tokenizer = tokenizer
        self._pool = pool
        self.dimension = int(config["hidden_size"])
        self.max_tokens = int(config.get("max_position_embeddings", 512)) - SPECIAL_TOKENS
        self._heads = int(config["num_attention_heads"])
        self._layers = int(config["num_hidden_layers"])
        self._eps = float(config.get("layer_norm_eps", 1e-12))

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        limit = self.max_tokens + SPECIAL_TOKENS
        return [
            encoding.ids[: limit - 1] + encoding.ids[-1:] if len(encoding.ids) > limit else encoding.ids
            for encoding in self._tokenizer.encode_batch(list(texts))
        ]

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        import numpy as np

        out = [self._embed_batch(self._ids(texts[i : i + BATCH])) for i in range(0, len(texts), BATCH)]
        return np.concatenate(out) if out else np.zeros((0, self.dimension), dtype=np.float32)

    def _linear(self, x: Any, name: str) -> Any:
        return x @ self._w[f"{name}.weight"].T + self._w[f"{name}.bias"]

    def _norm(self, x: Any, name: str) -> Any:
        import mlx.core as mx

        return mx.fast.layer_norm(x, self._w[f"{name}.weight"], self._w[f"{name}.bias"], self._eps)

    def _embed_batch(self, ids: list[list[int]]) -> npt.NDArray[np.float32]:
        import mlx.core as mx
        import numpy as np

        length = max(len(row) for row in ids)
        tokens = mx.array([row + [0] * (length - len(row)) for row in ids])
        mask = mx.array([[1.0] * len(row) + [0.0] * (length - len(row)) for row in ids])
        w, batch, heads = self._w, len(ids), self._heads
        x = w["embeddings.word_embeddings.weight"][tokens] + w["embeddings.position_embeddings.weight"][:length]
        x = self._norm(x + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
        bias = ((1.0 - mask) * -1e9)[:, None, None, :].astype(x.dtype)  # padding is never attended to
        head_dim = self.dimension // heads

        def split(t: Any) -> Any:
            return t.reshape(batch, length, heads, head_dim).transpose(0, 2, 1, 3)

        for i in range(self._layers):
            p = f"encoder.layer.{i}"
            q, k, v = (split(self._linear(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
            attended = mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(head_dim), mask=bias)
            attended = attended.transpose(0, 2, 1, 3).reshape(batch, length, self.dimension)
            x = self._norm(x + self._linear(attended, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            hidden = self._linear(x, f"{p}.intermediate.dense")
            hidden = 0.5 * hidden * (1.0 + mx.erf(hidden / math.sqrt(2.0)))  # GELU, exact (BERT's "gelu")
            x = self._norm(x + self._linear(hidden, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        if self._pool == "CLS":
            pooled = x[:, 0]
        else:
            pooled = (x * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        pooled = pooled / mx.linalg.norm(pooled, axis=1, keepdims=True)
        return np.asarray(pooled.astype(mx.float32), dtype=np.float32)

    def close(self) -> None:
        self._w = {}


def load_embedder(directory: Path) -> MlxEmbedder:
    from llmrun.formats.mlx_runtime import prepare_mlx

    fast = prepare_mlx() is not None
    import mlx.core as mx
    from tokenizers import Tokenizer

    from llmrun.formats.hf_gguf import pooling
    from llmrun.formats.mlx_header import read_json

    config = read_json(directory / "config.json", "model config JSON")
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        raise UsageError(f"{directory} is not a BERT model", "MLX embeddings support BERT-family directories")
    weights: dict[str, Any] = {}
    for path in sorted(directory.glob("*.safetensors")):
        try:
            loaded = mx.load(str(path))
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelFileError(f"cannot read {path}: {exc}", "re-download the model") from exc
        assert isinstance(loaded, dict)
        weights.update({name.removeprefix("bert."): value for name, value in loaded.items()})
    if fast and mx.default_device() == mx.cpu:  # float32 products go to the fast BLAS (formats.mlx_runtime)
        weights = {name: value.astype(mx.float32) for name, value in weights.items()}
    if "embeddings.word_embeddings.weight" not in weights:
        raise ModelFileError(f"{directory} has no BERT weights", "the directory is incomplete")
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return MlxEmbedder(directory, config, weights, tokenizer, pooling(directory))
