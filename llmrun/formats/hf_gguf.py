"""A Hugging Face safetensors directory → an F16 GGUF, written with the ``gguf`` package.

The pip wheels of llama-cpp-python do not ship llama.cpp's ``convert_hf_to_gguf.py``, so
the steps it takes for the architectures llmrun supports (llama, qwen2, gemma3) are done
here: hyper-parameters from ``config.json`` under GGUF keys (the ``gguf`` writer's own
helpers), tensor names through the ``gguf`` package's ``TensorNameMap``, llama's Q/K rows
permuted for llama.cpp's rope, Gemma's norms stored as 1 + w, llama-3 rope scaling as a
``rope_freqs`` tensor, and the vocabulary from ``tokenizer.json``: byte-level BPE as
``gpt2`` with its merges; SentencePiece-style (BPE with byte fallback, as transformers
ships Gemma and Llama 2) as ``llama`` with scores from the merge ranks.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.errors import ModelFileError, UsageError
from llmrun.files import Progress
from llmrun.formats.convert import permute_rows
from llmrun.formats.f16 import Tensor, Written, float_type, write_gguf
from llmrun.formats.hfconfig import LLAMA3_ROPE, llama3_rope_freqs
from llmrun.formats.output import check_destination, staged, tree_size

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3", "bert": "bert"}  # HF model_type → GGUF
BPE_PRE = {"llama": "llama-bpe", "qwen2": "qwen2"}  # llama.cpp's pre-tokenizer names
_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def architecture(config: dict[str, Any]) -> str:
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise UsageError(
            f"writing GGUF from a {model_type!r} model is not supported",
            f"supported: {', '.join(ARCHITECTURES)} (Hugging Face model_type)",
        )
    if "quantization" in config or "quantization_config" in config:
        raise UsageError("the model directory holds quantized weights", "start from the 16- or 32-bit model")
    return ARCHITECTURES[model_type]


def _int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelFileError(f"config.json lacks {key}, which the GGUF needs", "the model directory is incomplete")
    return value


def head_dim(config: dict[str, Any]) -> int:
    value = config.get("head_dim")
    return int(value) if isinstance(value, int) else _int(config, "hidden_size") // _int(config, "num_attention_heads")


def add_hparams(writer: Any, config: dict[str, Any], arch: str) -> None:
    """config.json's hyper-parameters under llama.cpp's keys (the inverse of ``hfconfig.hf_config``)."""
    n_heads = _int(config, "num_attention_heads")
    writer.add_context_length(int(config.get("max_position_embeddings") or 4096))
    writer.add_embedding_length(_int(config, "hidden_size"))
    writer.add_block_count(_int(config, "num_hidden_layers"))
    writer.add_feed_forward_length(_int(config, "intermediate_size"))
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or n_heads))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_rope_freq_base(float(config.get("rope_theta", 10_000.0)))
    dim = head_dim(config)
    writer.add_key_length(dim)
    writer.add_value_length(dim)
    if arch == "llama":
        writer.add_rope_dimension_count(dim)
        writer.add_vocab_size(_int(config, "vocab_size"))
    if arch == "gemma3":
        writer.add_sliding_window(int(config.get("sliding_window") or 512))
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type") if isinstance(scaling, dict) else None
    if kind == "linear":
        from gguf.constants import RopeScalingType

        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
    elif kind not in (None, "default", "llama3"):
        raise UsageError(f"rope scaling {kind!r} is not supported when writing GGUF", "")


POOLING_MODES = {"pooling_mode_mean_tokens": "MEAN", "pooling_mode_cls_token": "CLS"}


def pooling(directory: Path) -> str:
    """The sentence-transformers pooling (``1_Pooling/config.json``); mean when there is none."""
    from llmrun.formats.mlx_header import read_json

    path = directory / "1_Pooling" / "config.json"
    if not path.is_file():
        return "MEAN"
    config = read_json(path, "pooling config JSON")
    modes = [kind for key, kind in POOLING_MODES.items() if isinstance(config, dict) and config.get(key)]
    if len(modes) != 1:
        raise UsageError(f"{path}: only mean or CLS pooling is supported", "")
    return modes[0]


def add_encoder_hparams(writer: Any, config: dict[str, Any], pooled: str = "MEAN") -> None:
    """A BERT encoder's hyper-parameters: no causal mask, a pooled sentence embedding."""
    from gguf.constants import PoolingType

    writer.add_context_length(_int(config, "max_position_embeddings"))
    writer.add_embedding_length(_int(config, "hidden_size"))
    writer.add_block_count(_int(config, "num_hidden_layers"))
    writer.add_feed_forward_length(_int(config, "intermediate_size"))
    writer.add_head_count(_int(config, "num_attention_heads"))
    writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
    writer.add_causal_attention(False)
    writer.add_pooling_type(PoolingType[pooled])
    writer.add_token_type_count(int(config.get("type_vocab_size") or 1))


def rope_freqs(config: dict[str, Any]) -> Tensor | None:
    """llama-3 rope scaling as llama.cpp stores it: the per-dimension factors, a tensor."""
    import numpy as np

    scaling = config.get("rope_scaling")
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) != "llama3":
        return None
    if any(float(scaling.get(k, v)) != float(v) for k, v in LLAMA3_ROPE.items()):
        raise UsageError("this model's llama-3 rope parameters differ from Llama 3.1/3.2's", "not supported yet")
    values = np.asarray(
        llama3_rope_freqs(head_dim(config), float(config.get("rope_theta", 10_000.0)), float(scaling["factor"])),
        dtype=np.float32,
    )
    return Tensor("rope_freqs.weight", values.shape, lambda: values)


def name_map(arch: str, n_blocks: int) -> Callable[[str], str | None]:
    """Hugging Face tensor name → GGUF name (``None`` when the architecture has no such tensor)."""
    from gguf.constants import MODEL_ARCH_NAMES
    from gguf.tensor_mapping import TensorNameMap

    model_arch = next(a for a, name in MODEL_ARCH_NAMES.items() if name == arch)
    names = TensorNameMap(model_arch, n_blocks)  # built once: it lays out every block's names
    return lambda hf_name: names.get_name(hf_name, try_suffixes=(".weight", ".bias"))


def transform(arch: str, hf_name: str, values: npt.NDArray[np.float32], config: dict[str, Any]) -> Any:
    """What llama.cpp's converter changes in a tensor (undone by ``convert.restore``)."""
    if arch == "gemma3" and hf_name.endswith("norm.weight"):
        return values + 1.0
    if arch == "llama" and hf_name.endswith("self_attn.q_proj.weight"):
        return permute_rows(values, _int(config, "num_attention_heads"))
    if arch == "llama" and hf_name.endswith("self_attn.k_proj.weight"):
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        return permute_rows(values, heads)
    return values


def safetensors_tensors(directory: Path) -> dict[str, tuple[Path, int, str, tuple[int, ...], int, int]]:
    """name → (file, data start, dtype, shape, begin, end) over every safetensors file, bounded."""
    from llmrun.formats.mlx_header import safetensors_table

    found: dict[str, tuple[Path, int, str, tuple[int, ...], int, int]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        table, data_start = safetensors_table(path)
        size = path.stat().st_size
        for name, spec in table.items():
            if name == "__metadata__" or not isinstance(spec, dict) or _unused(name):
                continue
            dtype = spec.get("dtype")
            if dtype not in _DTYPES:
                raise UsageError(f"{path.name}: tensor {name} is {dtype}", "only F32, F16 and BF16 weights convert")
            shape = tuple(int(d) for d in spec.get("shape", ()))
            begin, end = (int(x) for x in spec.get("data_offsets", (0, 0)))
            count = 1
            for d in shape:
                count *= d
            if end - begin != count * int(_DTYPES[dtype][-1]) or data_start + end > size or begin < 0:
                raise ModelFileError(f"{path.name}: tensor {name} lies outside the file", "re-download the model")
            found[name] = (path, data_start, dtype, shape, begin, end)
    return found


def _unused(hf_name: str) -> bool:
    """Tensors llama.cpp computes (rope frequencies, BERT's position ids) or does not use (BERT's pooler)."""
    return hf_name.endswith(("rotary_emb.inv_freq", "embeddings.position_ids")) or hf_name.startswith("pooler.")


def _loader(entry: tuple[Path, int, str, tuple[int, ...], int, int]) -> Callable[[], npt.NDArray[np.float32]]:
    import numpy as np

    path, data_start, dtype, shape, begin, end = entry

    def load() -> npt.NDArray[np.float32]:
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start + begin, shape=(end - begin,))
        values = raw.view(_DTYPES[dtype])
        if dtype == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(values, dtype=np.float32).reshape(shape)

    return load


def _transformed(
    load: Callable[[], npt.NDArray[np.float32]], arch: str, hf_name: str, config: dict[str, Any]
) -> Callable[[], npt.NDArray[np.float32]]:
    return lambda: transform(arch, hf_name, load(), config)


def tensors(directory: Path, config: dict[str, Any], arch: str) -> list[Tensor]:
    to_gguf = name_map(arch, _int(config, "num_hidden_layers"))
    tied = bool(config.get("tie_word_embeddings", arch == "gemma3"))
    result: list[Tensor] = []
    for hf_name, entry in sorted(safetensors_tensors(directory).items()):
        if tied and hf_name == "lm_head.weight":
            continue
        name = to_gguf(hf_name)
        if name is None:
            raise UsageError(f"tensor {hf_name} has no GGUF name for {arch}", "the model is a variant not supported")
        result.append(Tensor(name, entry[3], _transformed(_loader(entry), arch, hf_name, config)))
    extra = rope_freqs(config) if arch == "llama" else None
    return result + ([extra] if extra else [])


# --- the vocabulary ------------------------------------------------------------------


def add_vocabulary(writer: Any, directory: Path, arch: str, vocab_size: int) -> None:
    from gguf.constants import TokenType
    from gguf.vocab import SpecialVocab

    path = directory / "tokenizer.json"
    try:
        tokenizer = json.loads(path.read_text(encoding="utf-8"))
        model = tokenizer["model"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", "the directory needs a tokenizer.json") from exc
    added = {int(t["id"]): t for t in tokenizer.get("added_tokens", []) if isinstance(t, dict)}
    pieces = _pieces(model)
    size = max(vocab_size, max(pieces, default=-1) + 1, max(added, default=-1) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [TokenType.UNUSED] * size
    for token_id, piece in pieces.items():
        tokens[token_id], types[token_id] = piece, TokenType.NORMAL
    for token_id, spec in added.items():
        tokens[token_id] = str(spec["content"])
        types[token_id] = TokenType.CONTROL if spec.get("special") else TokenType.USER_DEFINED
    byte_level = model.get("type") == "BPE" and not model.get("byte_fallback")
    if model.get("type") == "WordPiece":
        writer.add_tokenizer_model("bert")  # llama.cpp's WPM: word starts as "▁word", "##piece" as "piece"
        writer.add_tokenizer_pre("default")
        tokens = [_phantom(piece) for piece in tokens]
    elif byte_level:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(BPE_PRE.get(arch, "default"))
    elif model.get("type") in ("BPE", "Unigram"):
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_scores(_scores(model, tokens, types))
        for i, piece in enumerate(tokens):
            if types[i] == TokenType.NORMAL and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
                types[i] = TokenType.BYTE
        writer.add_add_space_prefix(_prepends_space(tokenizer))
    else:
        raise UsageError(f"{path.name}: a {model.get('type')} tokenizer is not supported", "")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    logging.getLogger("gguf").setLevel(logging.ERROR)  # its notes about the tokenizer are not the user's concern
    special = SpecialVocab(directory, load_merges=byte_level, n_vocab=size)
    special.add_to_gguf(writer, quiet=True)
    if not special.chat_template and (directory / "chat_template.jinja").is_file():
        writer.add_chat_template((directory / "chat_template.jinja").read_text(encoding="utf-8"))


def _phantom(piece: str) -> str:
    if piece.startswith("[") and piece.endswith("]"):
        return piece
    return piece[2:] if piece.startswith("##") else "\u2581" + piece


def _pieces(model: dict[str, Any]) -> dict[int, str]:
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        return {int(i): str(p) for p, i in vocab.items()}
    if isinstance(vocab, list):  # Unigram: [piece, score] by id
        return {i: str(entry[0]) for i, entry in enumerate(vocab)}
    raise UsageError("tokenizer.json has no vocabulary", "")


def _scores(model: dict[str, Any], tokens: list[str], types: list[Any]) -> list[float]:
    """SentencePiece scores: a Unigram's own, else minus the rank of the first merge making the token
    (llama.cpp's SPM tokenizer merges the highest-scoring pair first, as BPE applies merges in order)."""
    from gguf.constants import TokenType

    if model.get("type") == "Unigram":
        return [float(entry[1]) for entry in model["vocab"]] + [0.0] * (len(tokens) - len(model["vocab"]))
    index = {piece: i for i, piece in enumerate(tokens)}
    scores = [0.0] * len(tokens)
    for rank, merge in enumerate(model.get("merges", [])):
        left, right = merge if isinstance(merge, list) else str(merge).split(" ", 1)
        token_id = index.get(left + right)
        if token_id is not None and scores[token_id] == 0.0:
            scores[token_id] = -float(rank + 1)
    for i, kind in enumerate(types):
        if kind in (TokenType.CONTROL, TokenType.UNUSED):
            scores[i] = -1000.0
    return scores


def _prepends_space(tokenizer: dict[str, Any]) -> bool:
    """Whether the tokenizer puts "▁" before the text (Llama 2 does; Gemma does not)."""
    text = json.dumps(tokenizer.get("normalizer")) + json.dumps(tokenizer.get("pre_tokenizer"))
    return '"Prepend"' in text or '"add_prefix_space": true' in text or '"prepend_scheme": "always"' in text


# --- the conversion ----------------------------------------------------------------


def hf_to_gguf(
    source: Path, dest: Path, out_type: str = "F16", *, force: bool = False, progress: Progress | None = None
) -> Written:
    from llmrun.formats.mlx_quantize import read_config

    out_type = float_type(out_type)
    started = time.perf_counter()
    config = read_config(source)
    arch = architecture(config)
    items = tensors(source, config, arch)
    bytes_per = 4 if out_type == "F32" else 2
    check_destination(dest, force, tree_size(source) * bytes_per // 2 + 16 * 1024 * 1024, directory=False)

    def metadata(writer: Any) -> None:
        from llmrun.formats.f16 import FLOAT_TYPES

        writer.add_name(source.absolute().name)
        writer.add_file_type(FLOAT_TYPES[out_type])
        writer.add_quantization_version(2)
        if arch == "bert":
            add_encoder_hparams(writer, config, pooling(source))
        else:
            add_hparams(writer, config, arch)
        add_vocabulary(writer, source, arch, _int(config, "vocab_size"))

    step = progress or (lambda what, done, total: None)
    with staged(dest, force, directory=False) as staging:
        write_gguf(staging, arch, metadata, items, out_type, step)
    return Written(dest, arch, out_type, len(items), dest.stat().st_size, time.perf_counter() - started)
