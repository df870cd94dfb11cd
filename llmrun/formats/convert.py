"""``llmrun convert``: a GGUF file → an MLX model directory that mlx-lm loads strictly.

The textbook steps, each a function: read the GGUF (after the bounded header
check), map llama.cpp tensor names back to Hugging Face names (the ``gguf``
package's ``TensorNameMap``, inverted), dequantize each tensor with the ``gguf``
package, undo what llama.cpp's converter changed (Gemma norms stored +1, llama
Q/K rows permuted for its rope), load into the mlx-lm model class with strict
weight checking, quantize with MLX's affine quantization for 4/8 bit, and write
safetensors + ``config.json`` + a tokenizer rebuilt from the GGUF vocabulary.
The directory appears only when everything is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.errors import BackendError, ModelFileError, UsageError
from llmrun.files import Progress
from llmrun.formats.gguf_header import read_header
from llmrun.formats.hfconfig import LLAMA3_ROPE, SUPPORTED_ARCHITECTURES, hf_config, llama3_rope_freqs, unsupported
from llmrun.formats.output import check_destination, staged, tree_size

if TYPE_CHECKING:
    import numpy.typing as npt

MLX_BITS = (4, 8, 16)
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True, slots=True)
class Converted:
    path: Path
    architecture: str
    bits: int
    tensors: int
    size_bytes: int
    seconds: float
    bits_per_weight: float


def check_bits(bits: int, group_size: int) -> None:
    if bits not in MLX_BITS:
        raise UsageError(f"`bits` must be one of {', '.join(map(str, MLX_BITS))}, got {bits}", "")
    if group_size not in GROUP_SIZES:
        raise UsageError(f"`group_size` must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size}", "")


# --- tensor names and values (pure given the gguf package) --------------------------


def hf_names(architecture: str, n_blocks: int) -> dict[str, list[str]]:
    """GGUF tensor base name (``blk.0.attn_q``) → the Hugging Face names it may have come from."""
    from gguf.constants import MODEL_ARCH_NAMES
    from gguf.tensor_mapping import TensorNameMap

    arch = next((a for a, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise unsupported(architecture)
    inverse: dict[str, list[str]] = {}
    for hf_name, (_, gguf_name) in TensorNameMap(arch, n_blocks).mapping.items():
        inverse.setdefault(gguf_name, []).append(hf_name)
    return inverse


def permute_rows(weights: npt.NDArray[Any], n_head: int) -> npt.NDArray[Any]:
    """llama.cpp's Q/K permutation for llama-style rope (its converter's ``permute``)."""
    rows = weights.shape[0]
    return weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def unpermute_rows(weights: npt.NDArray[Any], n_head: int) -> npt.NDArray[Any]:
    """The inverse of :func:`permute_rows`."""
    rows = weights.shape[0]
    return weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def restore(architecture: str, hf_name: str, values: npt.NDArray[Any], config: dict[str, Any]) -> npt.NDArray[Any]:
    """Undo llama.cpp's conversion-time changes to one tensor."""
    if architecture == "gemma3" and hf_name.endswith("norm.weight"):
        return values - 1.0  # Gemma's RMSNorm scales by (1 + w); llama.cpp stores 1 + w
    if architecture == "llama" and hf_name.endswith("self_attn.q_proj.weight"):
        return unpermute_rows(values, config["num_attention_heads"])
    if architecture == "llama" and hf_name.endswith("self_attn.k_proj.weight"):
        return unpermute_rows(values, config["num_key_value_heads"])
    return values


def match_name(gguf_name: str, inverse: dict[str, list[str]], expected: set[str]) -> str | None:
    base, dot, suffix = gguf_name.rpartition(".")
    if not dot:
        return None
    for candidate in inverse.get(base, []):
        name = f"{candidate}.{suffix}"
        if name in expected:
            return name
    return None


# --- the conversion -----------------------------------------------------------------


def gguf_to_mlx(
    source: Path,
    dest: Path,
    *,
    bits: int = 16,
    group_size: int = 64,
    force: bool = False,
    progress: Progress | None = None,
) -> Converted:
    check_bits(bits, group_size)
    started = time.perf_counter()
    header = read_header(source)  # bounded: the gguf package's reader trusts lengths
    if header.architecture not in SUPPORTED_ARCHITECTURES:
        raise unsupported(header.architecture)
    check_destination(dest, force, _estimate(header.weight_bytes, bits), directory=True)

    step = progress or (lambda what, done, total: None)
    step("read the GGUF", 0, 1)
    from gguf import GGUFReader

    from llmrun.formats.mlx_runtime import prepare_mlx

    prepare_mlx()
    reader = GGUFReader(source)
    tensors = {t.name: t for t in reader.tensors}
    step("read the GGUF", 1, 1)
    config = hf_config(header, has_output_tensor="output.weight" in tensors)
    if "rope_freqs.weight" in tensors:
        config["rope_scaling"] = _llama3_scaling(tensors.pop("rope_freqs.weight"), config)
    with staged(dest, force, directory=True) as staging:
        model = _build_model(config, header.architecture, tensors, step)
        if bits != 16:
            step(f"quantize to {bits} bit", 0, 1)
            model, config = quantize_model(model, config, group_size, bits)
            step(f"quantize to {bits} bit", 1, 1)
        from mlx_lm.utils import compute_bits_per_weight, save_config, save_model

        bits_per_weight = float(compute_bits_per_weight(model))
        step("write safetensors", 0, 1)
        save_model(staging, model)
        save_config(config, staging / "config.json")
        step("write safetensors", 1, 1)
        step("rebuild the tokenizer", 0, 1)
        write_tokenizer(reader, header.architecture, header.chat_template, staging)
        step("rebuild the tokenizer", 1, 1)
    size = tree_size(dest)
    seconds = time.perf_counter() - started
    return Converted(dest, header.architecture, bits, len(tensors), size, seconds, bits_per_weight)


def _estimate(weight_bytes: int, bits: int) -> int:
    # a dequantized parameter is 2 bytes at 16 bit; affine 4/8 bit add a scale and bias per group
    return int(weight_bytes * 4 * (bits + 0.5) / 8)  # generous: GGUF weights are ≥4 bits each


def quantize_model(model: Any, config: dict[str, Any], group_size: int, bits: int) -> tuple[Any, dict[str, Any]]:
    """mlx-lm's affine quantization; it prints its bits-per-weight line, which must not reach stdout."""
    import contextlib
    import io

    from mlx_lm.utils import quantize_model as mlx_quantize

    with contextlib.redirect_stdout(io.StringIO()):
        quantized, config = mlx_quantize(model, config, group_size, bits)
    return quantized, config


def _llama3_scaling(tensor: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Recover llama-3 rope scaling from the ``rope_freqs`` tensor llama.cpp wrote instead of it."""
    import numpy as np

    values = np.asarray(tensor.data, dtype=np.float32).ravel()
    factor = float(values.max())
    expected = llama3_rope_freqs(config["head_dim"], config.get("rope_theta", 10_000.0), factor)
    if len(expected) != len(values) or not np.allclose(values, expected, rtol=1e-3):
        raise UsageError(
            "this GGUF's rope_freqs are not llama-3 rope scaling, which is the only kind the conversion knows",
            "convert the original Hugging Face model with mlx_lm.convert instead",
        )
    return {"rope_type": "llama3", "factor": factor, **LLAMA3_ROPE}


def _build_model(config: dict[str, Any], architecture: str, tensors: dict[str, Any], progress: Progress) -> Any:
    import mlx.core as mx
    import numpy as np
    from gguf.quants import dequantize
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    flat: list[Any] = list(tree_flatten(model.parameters()))
    expected = {str(pair[0]) for pair in flat}
    inverse = hf_names(architecture, config["num_hidden_layers"])
    weights: dict[str, Any] = {}
    for done, (gguf_name, tensor) in enumerate(tensors.items(), 1):
        hf_name = match_name(gguf_name, inverse, expected)
        if hf_name is None:
            raise ModelFileError(
                f"tensor {gguf_name} has no counterpart in mlx-lm's {config['model_type']} model",
                "the file may be a variant of the architecture the conversion does not know",
            )
        shape = tuple(int(d) for d in reversed(tensor.shape))
        try:
            values = dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
        except NotImplementedError:
            raise UsageError(
                f"the gguf package cannot dequantize {tensor.tensor_type.name} (tensor {gguf_name})",
                "convert from a file with another quant type (Q8_0, Q4_K_M, F16, …)",
            ) from None
        values = restore(architecture, hf_name, values, config)
        weights[hf_name] = mx.array(values).astype(mx.bfloat16)
        progress("dequantize tensors", done, len(tensors))
    weights = model.sanitize(weights)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise BackendError(f"mlx-lm did not accept the converted weights: {exc}", "report this with `debug`") from exc
    mx.eval(model.parameters())
    return model


# --- the tokenizer ----------------------------------------------------------------

_TOKENIZER_FIELDS = {
    "tokenizer.ggml.model": "tokenizer_type",
    "tokenizer.ggml.pre": "pre_tokenizer_type",
    "tokenizer.ggml.tokens": "tokens",
    "tokenizer.ggml.scores": "scores",
    "tokenizer.ggml.token_type": "token_type",
    "tokenizer.ggml.merges": "merges",
    "tokenizer.ggml.add_space_prefix": "add_prefix_space",
}
_SPECIAL = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def write_tokenizer(reader: Any, architecture: str, chat_template: str | None, directory: Path) -> None:
    """A Hugging Face tokenizer rebuilt from the GGUF vocabulary (transformers' GGUF converters)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        add_gguf_special_tokens,
        select_tokenizer_builder,
        set_split_regex,
    )

    spec = {name: value for key, name in _TOKENIZER_FIELDS.items() if (value := _field(reader, key)) is not None}
    try:
        tokenizer = select_tokenizer_builder(architecture, spec.get("tokenizer_type"))(spec)
    except ValueError as exc:
        raise UsageError(f"cannot rebuild the tokenizer: {exc}", "") from exc
    tokenizer = set_split_regex(add_gguf_special_tokens(tokenizer, spec), spec)
    tokens = spec["tokens"]
    for name, key in _SPECIAL.items():
        token_id = _field(reader, f"tokenizer.ggml.{key}")
        if isinstance(token_id, int) and 0 <= token_id < len(tokens):
            setattr(tokenizer, name, tokens[token_id])
    add_bos = _field(reader, "tokenizer.ggml.add_bos_token")
    tokenizer.add_bos_token = bool(add_bos if add_bos is not None else spec.get("tokenizer_type") == "llama")
    add_eos = _field(reader, "tokenizer.ggml.add_eos_token")
    tokenizer.add_eos_token = bool(add_eos)
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(directory))
