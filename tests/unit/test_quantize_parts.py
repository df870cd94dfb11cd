"""The pure parts of quantization: type choice, names, metrics, importance matrices, GGUF keys."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmrun.errors import ModelFileError, UsageError
from llmrun.formats.gguf_quantize import QUANT_TYPES, quant_type
from llmrun.formats.imatrix import read_imatrix
from llmrun.formats.output import staged
from llmrun.models.registry import load_registry
from llmrun.quantize import job
from llmrun.quantize.metrics import blocks, compare_rows
from tests.support.modelfiles import gguf_imatrix, legacy_imatrix

# --- types and names ------------------------------------------------------------------


def test_bits_and_types() -> None:
    assert quant_type(None, None).name == "Q4_K_M"
    assert quant_type(None, 4).name == "Q4_K_M"
    assert quant_type(None, 8).name == "Q8_0"
    assert quant_type("q5_k_m", None).name == "Q5_K_M"
    assert quant_type("Q6_K", 4).name == "Q6_K"  # --type wins over --bits
    with pytest.raises(UsageError) as caught:
        quant_type("Q9", None)
    assert "Q4_K_M" in caught.value.hint and "Q8_0" in caught.value.hint
    with pytest.raises(UsageError, match="`bits` must be 4 or 8"):
        quant_type(None, 3)
    assert all(t.needs_imatrix == t.name.startswith(("IQ1", "IQ2", "IQ3")) for t in QUANT_TYPES.values())


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("gemma-3-270m-F16", "gemma-3-270m"),
        ("Qwen2.5-0.5B-Instruct-BF16", "Qwen2.5-0.5B-Instruct"),
        ("model.q8_0", "model"),
        ("gemma-mlx-16bit", "gemma"),
        ("plain", "plain"),
    ],
)
def test_default_names_drop_the_source_precision(name: str, stem: str) -> None:
    assert job._stem(name) == stem


def test_store_names_never_replace_registry_or_pulled_models(hermetic_env: Path) -> None:
    from llmrun.models.store import editing_index

    registry = load_registry()
    assert job.store_name(None, "Gemma 3 (270M)-q4_k_m", registry, False) == "gemma-3-270m-q4_k_m"
    with pytest.raises(UsageError, match=r"is a model in models\.toml"):
        job.store_name("gemma3:270m", "x", registry, True)
    with pytest.raises(UsageError, match="is not a model name"):
        job.store_name("../evil", "x", registry, False)
    with editing_index() as models:
        files = [{"name": "m.gguf", "path": "/nowhere/m.gguf", "size": 1}]
        models["pulled-one"] = {"repo": "a/b", "files": files, "pulled": "2026-12-01T00:00:00"}
        models["made-one"] = {"repo": None, "origin": "local", "files": files, "pulled": "2026-12-01T00:00:00"}
    with pytest.raises(UsageError, match="pulled model"):
        job.store_name("pulled-one", "x", registry, True)
    with pytest.raises(UsageError, match="already in the local store"):
        job.store_name("made-one", "x", registry, False)
    assert job.store_name("made-one", "x", registry, True) == "made-one"


def test_target_format_refuses_options_of_the_other_format() -> None:
    gguf = job.Source("m", "m", Path("m.gguf"), "gguf")
    directory = job.Source("d", "d", Path("d"), "dir")
    assert job.target_format(job.Request("m"), gguf) == "gguf"
    assert job.target_format(job.Request("d"), directory) == "mlx"
    assert job.target_format(job.Request("d", format="gguf"), directory) == "gguf"
    with pytest.raises(UsageError, match="`type` names a GGUF"):
        job.target_format(job.Request("d", type="Q4_0"), directory)
    with pytest.raises(UsageError, match="`group_size` applies to MLX"):
        job.target_format(job.Request("m", group_size=32), gguf)
    with pytest.raises(UsageError, match="`format` must be gguf or mlx"):
        job.target_format(job.Request("m", format="onnx"), gguf)


# --- metrics on hand-built distributions --------------------------------------------


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p = np.exp(p_logits - np.logaddexp.reduce(p_logits))
    q = np.exp(q_logits - np.logaddexp.reduce(q_logits))
    return float(np.sum(p * np.log(p / q)))


def test_identical_models_agree_completely() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 11)).astype(np.float32)
    ids = [0, 3, 1, 4, 1, 5]
    result = compare_rows([logits], [logits.copy()], ids)
    assert result.positions == 5
    assert result.top1_agreement == 1.0
    assert result.mean_kl == pytest.approx(0.0, abs=1e-6)
    assert result.perplexity_reference == pytest.approx(result.perplexity_candidate)


def test_kl_perplexity_and_agreement_match_their_definitions() -> None:
    ref = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], dtype=np.float32))
    cand = np.log(np.array([[0.5, 0.4, 0.1], [0.6, 0.2, 0.2]], dtype=np.float32))
    ids = [9, 0, 2]  # position 0 predicts 0, position 1 predicts 2
    result = compare_rows([ref], [cand], ids)
    assert result.positions == 2
    assert result.top1_agreement == 0.5  # argmax 0 = 0, then 2 ≠ 0
    assert result.mean_kl == pytest.approx((_kl(ref[0], cand[0]) + _kl(ref[1], cand[1])) / 2, rel=1e-5)
    assert result.perplexity_reference == pytest.approx(math.exp(-(math.log(0.7) + math.log(0.8)) / 2), rel=1e-5)
    assert result.perplexity_candidate == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.2)) / 2), rel=1e-5)


def test_chunking_does_not_change_the_result() -> None:
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(150, 7)).astype(np.float32)
    cand = ref + rng.normal(scale=0.3, size=ref.shape).astype(np.float32)
    ids = list(rng.integers(0, 7, size=150))
    whole = compare_rows([ref], [cand], ids)
    pieces = compare_rows([ref[i : i + 1] for i in range(150)], [cand[:100], cand[100:]], ids)
    assert whole.mean_kl == pytest.approx(pieces.mean_kl, rel=1e-6)
    assert whole.top1_agreement == pieces.top1_agreement
    assert whole.positions == pieces.positions == 149
    assert [len(b) for b in blocks([ref[:10], ref[10:]], size=64)] == [64, 64, 22]


def test_different_vocabularies_are_refused() -> None:
    with pytest.raises(ValueError, match="vocabularies differ"):
        compare_rows([np.zeros((2, 5), np.float32)], [np.zeros((2, 6), np.float32)], [0, 1, 2])


# --- importance matrices ----------------------------------------------------------------


def test_legacy_imatrix_is_averaged_over_its_calls(tmp_path: Path) -> None:
    path = tmp_path / "m.dat"
    legacy_imatrix(path, {"blk.0.attn_q.weight": (4, [4.0, 8.0]), "output.weight": (0, [1.0])})
    matrix = read_imatrix(path)
    assert matrix["blk.0.attn_q.weight"].tolist() == [1.0, 2.0]
    assert matrix["output.weight"].tolist() == [1.0]


def test_gguf_imatrix_divides_sums_by_counts(tmp_path: Path) -> None:
    path = gguf_imatrix(tmp_path / "m.gguf")
    assert read_imatrix(path)["blk.0.ffn_up.weight"].tolist() == [1.0, 2.0, 3.0, 1.0]


def test_damaged_imatrix_files_are_refused(tmp_path: Path) -> None:
    truncated = tmp_path / "t.dat"
    legacy_imatrix(truncated, {"x": (1, [1.0, 2.0])})
    truncated.write_bytes(truncated.read_bytes()[:-3])
    with pytest.raises(ModelFileError, match="truncated"):
        read_imatrix(truncated)
    huge = tmp_path / "h.dat"
    huge.write_bytes(struct.pack("<i", 2**30))
    with pytest.raises(ModelFileError, match="not an importance matrix"):
        read_imatrix(huge)
    with pytest.raises(UsageError, match="does not exist"):
        read_imatrix(tmp_path / "missing.dat")


# --- safetensors → GGUF pieces ---------------------------------------------------------

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "vocab_size": 100,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def test_hparams_are_the_inverse_of_the_mlx_config(tmp_path: Path) -> None:
    """config.json → GGUF keys → (the MLX converter's mapping) → the same config values."""
    from gguf import GGUFWriter

    from llmrun.formats.gguf_header import read_header
    from llmrun.formats.hf_gguf import add_hparams, rope_freqs
    from llmrun.formats.hfconfig import hf_config

    path = tmp_path / "keys.gguf"
    writer = GGUFWriter(path, "llama")
    add_hparams(writer, LLAMA, "llama")
    writer.add_token_list([f"t{i}" for i in range(100)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    back = hf_config(read_header(path), has_output_tensor=True)
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        assert back[key] == LLAMA[key], key
    assert back["rope_theta"] == LLAMA["rope_theta"]
    assert back["rms_norm_eps"] == pytest.approx(LLAMA["rms_norm_eps"])
    assert back["head_dim"] == 16
    freqs = rope_freqs(LLAMA)
    assert freqs is not None and freqs.shape == (8,) and float(freqs.values().max()) == 32.0


def test_llama_qk_permutation_is_undone_by_the_mlx_converter() -> None:
    from llmrun.formats.convert import restore
    from llmrun.formats.hf_gguf import name_map, transform

    q = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    k = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
    for name, values in (("model.layers.0.self_attn.q_proj.weight", q), ("model.layers.0.self_attn.k_proj.weight", k)):
        written = transform("llama", name, values, LLAMA)
        assert not np.array_equal(written, values)
        assert np.array_equal(restore("llama", name, written, LLAMA), values)
    norm = np.zeros(4, dtype=np.float32)
    assert transform("gemma3", "model.norm.weight", norm, {}).tolist() == [1.0] * 4
    assert name_map("llama", 2)("model.layers.1.mlp.down_proj.weight") == "blk.1.ffn_down.weight"
    assert name_map("qwen2", 2)("model.embed_tokens.weight") == "token_embd.weight"
    assert name_map("llama", 2)("lm_head.weight") == "output.weight"


def test_sentencepiece_scores_follow_the_merge_ranks() -> None:
    from gguf.constants import TokenType

    from llmrun.formats.hf_gguf import _prepends_space, _scores

    tokens = ["<pad>", "a", "b", "ab", "abb", "c"]
    types: list[Any] = [TokenType.CONTROL] + [TokenType.NORMAL] * 5
    model = {"type": "BPE", "merges": [["a", "b"], ["ab", "b"], "a bb"]}
    scores = _scores(model, tokens, types)
    assert scores[0] == -1000.0
    assert scores[3] > scores[4]  # "ab" is merged before "abb"
    assert scores[1] == scores[2] == scores[5] == 0.0  # single characters are not merged
    assert _prepends_space({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}]}})
    assert not _prepends_space({"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}})


def test_unsupported_models_are_named() -> None:
    from llmrun.formats.hf_gguf import architecture

    with pytest.raises(UsageError, match="'mistral3'"):
        architecture({"model_type": "mistral3"})
    with pytest.raises(UsageError, match="quantized weights"):
        architecture({"model_type": "llama", "quantization": {"bits": 4}})


# --- staged output ----------------------------------------------------------------------


def test_staged_output_appears_only_when_complete(tmp_path: Path) -> None:
    dest = tmp_path / "out.gguf"
    with pytest.raises(RuntimeError), staged(dest, False, directory=False) as staging:
        staging.write_text("half")
        raise RuntimeError("disk full")
    assert not dest.exists() and not list(tmp_path.iterdir())
    with staged(dest, False, directory=False) as staging:
        staging.write_text("whole")
    assert dest.read_text() == "whole"
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("old")
    with staged(folder, True, directory=True) as staging:
        (staging / "config.json").write_text("new")
    assert (folder / "config.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out.gguf"]


def test_a_full_disk_is_one_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    import errno

    from llmrun.errors import StoreError

    dest = tmp_path / "m.gguf"
    with pytest.raises(StoreError, match="disk filled up"), staged(dest, False, directory=False) as staging:
        staging.write_text("part")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert not list(tmp_path.iterdir())


def test_the_report_refuses_to_load_two_models_that_do_not_fit() -> None:
    from llmrun.errors import InsufficientMemory
    from llmrun.quantize.evaluate import Side, check_memory

    big = Side("f16", Path("f16.gguf"), "gguf", "F16", 14 * 2**30)
    small = Side("q4", Path("q4.gguf"), "gguf", "Q4_K_M", 4 * 2**30)
    check_memory(big, small, 24 * 2**30)
    with pytest.raises(InsufficientMemory, match="both are loaded at once") as caught:
        check_memory(big, small, 16 * 2**30)
    assert "`no_eval`" in caught.value.hint
