"""The pure parts of GGUF → MLX conversion: config mapping, tensor fixes, names."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from llmrun.errors import ModelFileError, UsageError
from llmrun.formats.convert import check_bits, hf_names, match_name, permute_rows, restore, unpermute_rows
from llmrun.formats.gguf_header import read_header
from llmrun.formats.hfconfig import hf_config, llama3_rope_freqs
from tests.support import ggufbuild

GEMMA = {
    "general.architecture": "gemma3",
    "gemma3.block_count": 18,
    "gemma3.embedding_length": 640,
    "gemma3.feed_forward_length": 2048,
    "gemma3.attention.head_count": 4,
    "gemma3.attention.head_count_kv": 1,
    "gemma3.attention.key_length": 256,
    "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
    "gemma3.context_length": 32768,
    "gemma3.rope.freq_base": 1000000.0,
    "gemma3.attention.sliding_window": 512,
    "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>", "a"],
    "tokenizer.ggml.bos_token_id": 2,
    "tokenizer.ggml.eos_token_id": 1,
}


def test_gemma3_config(tmp_path: Path) -> None:
    header = read_header(ggufbuild.write(tmp_path / "g.gguf", GEMMA, [("token_embd.weight", (640, 4), 0)]))
    config = hf_config(header, has_output_tensor=False)
    assert config["model_type"] == "gemma3_text"
    assert config["num_hidden_layers"] == 18
    assert config["num_key_value_heads"] == 1
    assert config["head_dim"] == 256
    assert config["vocab_size"] == 4
    assert config["tie_word_embeddings"] is True
    assert config["query_pre_attn_scalar"] == 256
    assert config["rope_local_base_freq"] == 10_000.0
    assert config["sliding_window"] == 512
    assert config["bos_token_id"] == 2
    assert math.isclose(config["rope_theta"], 1e6)


def test_unsupported_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    meta = {**GEMMA, "general.architecture": "falcon"}
    header = read_header(ggufbuild.write(tmp_path / "f.gguf", meta, [("x.weight", (4,), 0)]))
    with pytest.raises(UsageError) as caught:
        hf_config(header, False)
    assert "gemma3, llama, qwen2" in caught.value.hint


def test_missing_hyperparameter_is_a_clear_error(tmp_path: Path) -> None:
    meta = {k: v for k, v in GEMMA.items() if k != "gemma3.feed_forward_length"}
    header = read_header(ggufbuild.write(tmp_path / "g.gguf", meta, [("x.weight", (4,), 0)]))
    with pytest.raises(ModelFileError, match="feed_forward_length"):
        hf_config(header, False)


def test_unpermute_inverts_llama_cpp_permute() -> None:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((8 * 16, 32)).astype(np.float32)
    for heads in (8, 2):
        permuted = permute_rows(weights, heads)
        assert not np.array_equal(permuted, weights)
        assert np.array_equal(unpermute_rows(permuted, heads), weights)


def test_restore_fixes_gemma_norms_and_llama_qk() -> None:
    norm = np.full(4, 1.25, dtype=np.float32)
    assert np.allclose(restore("gemma3", "model.layers.0.input_layernorm.weight", norm, {}), 0.25)
    assert np.allclose(restore("gemma3", "model.layers.0.self_attn.q_norm.weight", norm, {}), 0.25)
    assert np.array_equal(restore("qwen2", "model.norm.weight", norm, {}), norm)
    q = np.arange(64, dtype=np.float32).reshape(16, 4)
    config = {"num_attention_heads": 4, "num_key_value_heads": 2}
    assert np.array_equal(restore("llama", "model.layers.0.self_attn.q_proj.weight", permute_rows(q, 4), config), q)
    assert np.array_equal(restore("llama", "model.layers.0.self_attn.k_proj.weight", permute_rows(q, 2), config), q)


def test_names_map_back_to_hugging_face() -> None:
    inverse = hf_names("gemma3", 2)
    expected = {
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.post_feedforward_layernorm.weight",
        "model.norm.weight",
    }
    assert match_name("token_embd.weight", inverse, expected) == "model.embed_tokens.weight"
    assert match_name("blk.1.attn_q.weight", inverse, expected) == "model.layers.1.self_attn.q_proj.weight"
    assert match_name("blk.0.post_ffw_norm.weight", inverse, expected) == (
        "model.layers.0.post_feedforward_layernorm.weight"
    )
    assert match_name("output_norm.weight", inverse, expected) == "model.norm.weight"
    assert match_name("blk.9.unknown.weight", inverse, expected) is None


def test_llama3_rope_freqs_shape() -> None:
    freqs = llama3_rope_freqs(64, 500000.0, 32.0)
    assert len(freqs) == 32
    assert freqs[0] == 1.0  # high frequencies unscaled
    assert freqs[-1] == 32.0  # low frequencies divided by the factor
    assert all(a <= b for a, b in itertools.pairwise(freqs))


@pytest.mark.parametrize(("bits", "group"), [(3, 64), (16, 48)])
def test_check_bits(bits: int, group: int) -> None:
    with pytest.raises(UsageError):
        check_bits(bits, group)
