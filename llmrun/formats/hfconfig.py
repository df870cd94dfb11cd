"""Hugging Face ``config.json`` values from GGUF metadata (pure).

A GGUF stores the hyper-parameters llama.cpp needs under ``<arch>.*`` keys; an
MLX (Hugging Face layout) model wants them under ``config.json`` names. Some
values a GGUF does not carry (Gemma 3's local rope base, its attention scale
for most sizes); those come from the architecture's published configs.
"""

from __future__ import annotations

from typing import Any

from llmrun.errors import ModelFileError, UsageError
from llmrun.formats.gguf_header import ArraySummary, GgufHeader

MODEL_TYPES = {"gemma3": "gemma3_text", "llama": "llama", "qwen2": "qwen2"}  # GGUF arch → mlx-lm model_type
SUPPORTED_ARCHITECTURES = tuple(MODEL_TYPES)

# llama-3.1/3.2's rope scaling, as their config.json files give it; GGUF keeps only the
# resulting per-dimension factors (the rope_freqs tensor), which `llama3_rope_freqs` recomputes.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def unsupported(architecture: str) -> UsageError:
    return UsageError(
        f"converting {architecture!r} models is not supported",
        f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}",
    )


def _required(header: GgufHeader, key: str) -> Any:
    value = header.arch_value(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelFileError(
            f"{header.path.name} lacks {header.architecture}.{key}, which the conversion needs",
            "the file's metadata is incomplete; use a GGUF written by llama.cpp's converter",
        )
    return value


def vocab_size(header: GgufHeader) -> int:
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, ArraySummary):
        return tokens.length
    if isinstance(tokens, list):
        return len(tokens)
    raise ModelFileError(f"{header.path.name} has no vocabulary", "use a GGUF that includes its tokenizer")


def hf_config(header: GgufHeader, has_output_tensor: bool) -> dict[str, Any]:
    """The ``config.json`` of the model in ``header`` (raises for unsupported architectures)."""
    arch = header.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise unsupported(arch)
    n_heads = int(_required(header, "attention.head_count"))
    hidden = int(_required(header, "embedding_length"))
    n_layers = int(_required(header, "block_count"))
    head_dim = header.arch_value("attention.key_length") or hidden // n_heads
    config: dict[str, Any] = {
        "model_type": MODEL_TYPES[arch],
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "intermediate_size": int(_required(header, "feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(header.arch_value("attention.head_count_kv") or n_heads),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(f"{_required(header, 'attention.layer_norm_rms_epsilon'):.6g}"),  # float32 noise off
        "vocab_size": vocab_size(header),
        "max_position_embeddings": int(header.arch_value("context_length") or 4096),
        "tie_word_embeddings": not has_output_tensor,
    }
    theta = header.arch_value("rope.freq_base")
    if isinstance(theta, int | float) and not isinstance(theta, bool):
        config["rope_theta"] = float(theta)
    for key in ("bos_token_id", "eos_token_id"):
        value = header.metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(value, int):
            config[key] = value
    if arch == "gemma3":
        config.update(_gemma3(header, hidden, n_heads, n_layers, int(head_dim)))
    return config


def _gemma3(header: GgufHeader, hidden: int, n_heads: int, n_layers: int, head_dim: int) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "sliding_window": int(header.arch_value("attention.sliding_window") or 512),
        "sliding_window_pattern": int(header.arch_value("attention.sliding_window_pattern") or 6),
        # not in GGUF: every Gemma 3 config uses 10k for the local (sliding) layers
        "rope_local_base_freq": 10_000.0,
        # llama.cpp: 1/sqrt(hidden/heads) for the 27B model (62 layers), 1/sqrt(head_dim) otherwise
        "query_pre_attn_scalar": hidden // n_heads if n_layers == 62 else head_dim,
    }
    scaling = header.arch_value("rope.scaling.type")
    factor = header.arch_value("rope.scaling.factor")
    if scaling == "linear" and isinstance(factor, int | float) and factor != 1:
        extra["rope_scaling"] = {"rope_type": "linear", "factor": float(factor)}
    return extra


def llama3_rope_freqs(head_dim: int, theta: float, factor: float) -> list[float]:
    """The per-dimension divisors llama.cpp stores in ``rope_freqs`` for llama-3 rope scaling."""
    import math

    low, high = LLAMA3_ROPE["low_freq_factor"], LLAMA3_ROPE["high_freq_factor"]
    old_context = LLAMA3_ROPE["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    result = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            result.append(1.0)
        elif wavelen > low_wavelen:
            result.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            result.append(1 / ((1 - smooth) / factor + smooth))
    return result
