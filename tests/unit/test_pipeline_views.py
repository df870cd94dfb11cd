"""Pure pieces behind tokenize, next, show and bench, on hand-computed values."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from llmrun.decoding.sampling import REMOVED_BY, SamplingParams, entropy_bits, log_softmax, sampling_stages, top_indices
from llmrun.decoding.tokens import spans, visible
from llmrun.engine.benchmark import Spread
from llmrun.formats.gguf_header import read_header
from llmrun.formats.memory import (
    geometry,
    kv_cache_bytes,
    largest_context,
    overhead_bytes,
    parameter_count,
    plan,
    swa_layer_count,
    weights_by_type,
)
from tests.support import ggufbuild as gb

MiB = 1024 * 1024


def test_spans_group_byte_fallback_tokens_into_whole_characters() -> None:
    pieces = {1: b"Hi", 2: b" ", 3: b"\xf0", 4: b"\x93", 5: b"\x80\x80", 6: b"!"}
    result = spans([1, 2, 3, 4, 5, 6], pieces.__getitem__)
    assert [(s.ids, s.text, s.byte_fallback) for s in result] == [
        ((1,), "Hi", False),
        ((2,), " ", False),
        ((3, 4, 5), "𓀀", True),
        ((6,), "!", False),
    ]


def test_spans_never_hide_bytes_that_make_no_character() -> None:
    assert [s.text for s in spans([1, 2], {1: b"\xff", 2: b"\xf0\x9f"}.__getitem__)] == ["\ufffd", "\ufffd"]


def test_visible_whitespace() -> None:
    assert visible(" the") == "␣the"
    assert visible("a\n") == "a↵"
    assert visible("word") == "word"


def test_sampling_stages_on_a_hand_built_distribution() -> None:
    # probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (logits are their logs)
    probs = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    logits = np.log(probs)
    stages = sampling_stages(logits, SamplingParams(temperature=1.0, top_k=4, top_p=0.85, min_p=0.3))
    # top-k 4 drops the last; top-p 0.85 of (.533, .267, .133, .067) keeps three; min-p 0.3 drops .143
    assert [REMOVED_BY[c] for c in stages.removed_by] == ["", "", "min-p", "top-p", "top-k"]
    assert stages.survivors == 2
    assert stages.final.tolist() == pytest.approx([2 / 3, 1 / 3, 0, 0, 0])
    assert stages.raw.tolist() == pytest.approx(probs.tolist())


def test_temperature_reshapes_only_the_survivors() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.1]))
    stages = sampling_stages(logits, SamplingParams(temperature=0.5, top_k=2, top_p=1.0, min_p=0.0))
    assert stages.tempered.tolist() == pytest.approx([0.36 / 0.46, 0.09 / 0.46, 0.01 / 0.46])
    assert stages.final.tolist() == pytest.approx([0.8, 0.2, 0.0])


def test_greedy_stage_marks_everything_else() -> None:
    stages = sampling_stages(np.array([1.0, 3.0, 2.0]), SamplingParams(temperature=0))
    assert [REMOVED_BY[c] for c in stages.removed_by] == ["greedy", "", "greedy"]
    assert stages.final.tolist() == [0.0, 1.0, 0.0]


def test_log_softmax_top_indices_and_entropy() -> None:
    logits = np.array([0.0, math.log(3.0)])
    assert np.exp(log_softmax(logits)).tolist() == pytest.approx([0.25, 0.75])
    assert top_indices(np.array([0.1, 0.9, 0.5, 0.9]), 3) == [1, 3, 2]
    assert entropy_bits(np.array([0.5, 0.5, 0.0])) == pytest.approx(1.0)


def test_kv_and_weights_for_a_llama_style_model(tmp_path: Path) -> None:
    meta = {
        **gb.LLAMA_META,
        "llama.block_count": 16,
        "llama.embedding_length": 2048,
        "llama.attention.head_count": 32,
        "llama.attention.head_count_kv": 8,
        "llama.context_length": 131072,
    }
    header = read_header(gb.write(tmp_path / "llama.gguf", meta, [("a", (64, 2), 0), ("b", (32,), 0)]))
    geom = geometry(header)
    assert geom is not None and geom.n_swa_layers == 0
    # 16 layers × 8 KV heads × (64 + 64) dims × 4096 tokens × 2 bytes = 128 MiB (Llama 3.2 1B at 4k)
    assert kv_cache_bytes(geom, 4096) == 128 * MiB
    assert kv_cache_bytes(geom, 4096, "q8_0") == 128 * MiB * 34 // 64
    assert kv_cache_bytes(geom, 4096, swa_full=False) == 128 * MiB
    assert parameter_count(header) == 64 * 2 + 32
    assert weights_by_type(header) == {"F32": (2, (128 + 32) * 4)}


def test_kv_for_gemma3_counts_sliding_window_layers(tmp_path: Path) -> None:
    meta = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 18,
        "gemma3.embedding_length": 640,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1,
        "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
        "gemma3.context_length": 32768,
        "gemma3.attention.sliding_window": 512,
    }
    header = read_header(gb.write(tmp_path / "gemma.gguf", meta, [("w", (8,), 0)]))
    geom = geometry(header)
    assert geom is not None
    assert (geom.sliding_window, geom.n_swa_layers) == (512, 15)  # layers 5, 11 and 17 are global
    # full: 18 layers × 1 head × 512 × 4096 × 2 = 72 MiB; windowed: 3 × 4096 + 15 × 1024 cells
    assert kv_cache_bytes(geom, 4096) == 72 * MiB
    assert kv_cache_bytes(geom, 4096, swa_full=False) == 1024 * (3 * 4096 + 15 * 1024)
    assert swa_layer_count("gemma2", 4) == 2
    assert swa_layer_count("llama", 16) == 0


def test_largest_context_is_the_last_that_fits(tmp_path: Path) -> None:
    header = read_header(gb.write(tmp_path / "m.gguf", gb.LLAMA_META, [("w", (64,), 0)]))
    budget = plan(header, 1000).total_bytes
    best = largest_context(header, budget)
    assert best >= 1000
    assert plan(header, best).total_bytes <= budget < plan(header, best + 1).total_bytes
    assert largest_context(header, 0) == 0
    assert largest_context(header, 10**15) == 2048  # capped at the trained length
    assert overhead_bytes(None, 10) == overhead_bytes(geometry(header), 10)  # no vocabulary: runtime only


def test_spread() -> None:
    assert Spread.of([1.0, 2.0, 3.0]) == Spread(2.0, 1.0)
    assert Spread.of([5.0]) == Spread(5.0, 0.0)
