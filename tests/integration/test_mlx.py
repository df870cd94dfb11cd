"""The MLX backend on the packaged Gemma, converted from its GGUF by `llmrun convert`.

Correctness across backends: teacher-forced top-1 agreement with llama.cpp, the
same greedy continuation, the same tokens; then the MLX-specific parts (prompt
cache reuse across chat turns, quantized and rotating KV caches) and the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmrun.backends.base import Done, LoadParams, Token
from llmrun.backends.gguf import GgufBackend, GgufModel
from llmrun.backends.mlx import MlxBackend, MlxModel
from llmrun.chat import ChatSession
from llmrun.pipeline import conversation_ids
from llmrun.quantize.metrics import compare
from llmrun.quantize.texts import ENGLISH as TEXT
from llmrun.sampling import SamplingParams
from llmrun.template import BUILTIN_TEMPLATES
from tests.helpers import invoke, llmrun

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf_model(gemma_cache: Path) -> Iterator[GgufModel]:
    model = GgufBackend().load(gemma_cache, LoadParams(1024, 2, 0))
    yield model
    model.close()


@pytest.fixture(scope="module")
def mlx16(gemma_mlx16: Path) -> Iterator[MlxModel]:
    model = MlxBackend().load(gemma_mlx16, LoadParams(1024, 2, 0))
    yield model
    model.close()


def test_converted_directory_is_what_mlx_lm_expects(gemma_mlx16: Path, gemma_mlx8: Path) -> None:
    config = json.loads((gemma_mlx16 / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"
    assert config["tie_word_embeddings"] is True
    assert "quantization" not in config
    assert json.loads((gemma_mlx8 / "config.json").read_text())["quantization"] == {
        "group_size": 64,
        "bits": 8,
        "mode": "affine",
    }
    assert (gemma_mlx16 / "tokenizer.json").is_file()
    size = lambda d: sum(f.stat().st_size for f in d.glob("*.safetensors"))  # noqa: E731
    assert 0.45 < size(gemma_mlx8) / size(gemma_mlx16) < 0.65  # 8.5 bits per weight vs 16


def test_tokenizer_rebuilt_from_gguf_matches_llama_cpp(gguf_model: GgufModel, mlx16: MlxModel) -> None:
    for text in ["The capital of France is", "  two  spaces\n\ttab", "안녕하세요, world 🦜", "<start_of_turn>user\nhi"]:
        assert mlx16.tokenize(text, add_bos=True) == gguf_model.tokenize(text, add_bos=True)
        assert mlx16.tokenize(text, special=True) == gguf_model.tokenize(text, special=True)
    assert (mlx16.bos_id, mlx16.eos_id, mlx16.adds_bos) == (gguf_model.bos_id, gguf_model.eos_id, gguf_model.adds_bos)
    for token_id in (2, 106, 236743, 9259, 255999, 238):
        assert mlx16.token_bytes(token_id) == gguf_model.token_bytes(token_id)


def test_teacher_forced_predictions_agree_with_gguf(gguf_model: GgufModel, mlx16: MlxModel, gemma_mlx8: Path) -> None:
    ids = gguf_model.tokenize(TEXT, add_bos=True)[:300]
    assert len(ids) >= 257
    full = compare(gguf_model, mlx16, ids)
    assert full.positions >= 256
    assert full.top1_agreement >= 0.95, full
    # both are close to the GGUF they came from: perplexities within 10% of it
    assert abs(full.perplexity_candidate / full.perplexity_reference - 1) < 0.10, full


def test_eight_bit_model_agrees_with_gguf(gguf_model: GgufModel, gemma_mlx8: Path) -> None:
    """On the CPU the backend expands the 8-bit weights (exactly their quantized values) to
    bfloat16: mlx's CPU quantized kernels take ~3 s a token and are inexact (see expand_on_cpu)."""
    import mlx.nn as nn

    mlx8 = MlxBackend().load(gemma_mlx8, LoadParams(1024, 2, 0))
    try:
        assert not [m for _, m in mlx8.model.named_modules() if isinstance(m, nn.QuantizedLinear)]
        ids = gguf_model.tokenize(TEXT, add_bos=True)[:300]
        eight = compare(gguf_model, mlx8, ids)
    finally:
        mlx8.close()
    assert eight.positions >= 256
    assert eight.top1_agreement >= 0.90, eight
    assert abs(eight.perplexity_candidate / eight.perplexity_reference - 1) < 0.10, eight


def test_greedy_continuation_agrees_with_gguf(gguf_model: GgufModel, mlx16: MlxModel) -> None:
    """The first 16 greedy tokens of "The capital of France is", position by position.

    Each step is compared on the GGUF's own greedy prefix. Where llama.cpp's top two logits
    are closer than 0.1 the call is within numerical noise: llama.cpp itself picks differently
    there depending on whether it evaluates one token or a batch (it does at step 12 of this
    prompt: a 0.02 margin), and bfloat16 logits resolve 0.06 at that magnitude. There the MLX
    choice must be one of llama.cpp's top two; everywhere else it must be the same token.
    """
    import numpy as np

    prompt = gguf_model.tokenize("The capital of France is", add_bos=True)
    greedy = [
        e.id for e in gguf_model.stream(prompt, SamplingParams(temperature=0, max_tokens=16)) if isinstance(e, Token)
    ]
    assert len(greedy) == 16
    close_calls = 0
    for step in range(16):
        context = prompt + greedy[:step]
        reference = gguf_model.logits(context)
        top2 = np.argsort(reference)[-2:][::-1]
        margin = float(reference[top2[0]] - reference[top2[1]])
        choice = int(np.argmax(mlx16.logits(context)))
        if margin >= 0.1:
            assert choice == greedy[step], (step, margin)
        else:
            close_calls += 1
            assert choice in top2, (step, margin)
    assert close_calls <= 4  # most steps are compared exactly


def test_seeded_sampling_repeats_and_reports_logprobs(mlx16: MlxModel) -> None:
    ids = mlx16.tokenize("Once upon a time", add_bos=True)
    params = SamplingParams(temperature=0.9, top_k=20, seed=7, max_tokens=6)
    first = list(mlx16.stream(ids, params, logprobs=3))
    again = list(mlx16.stream(ids, params))
    assert isinstance(first[-1], Done) and isinstance(again[-1], Done)
    assert first[-1].text == again[-1].text
    assert first[-1].stats.seed == 7
    token = first[0]
    assert isinstance(token, Token) and token.logprob is not None and len(token.top) == 3
    assert token.logprob <= token.top[0].logprob + 1e-6


def test_chat_turns_reuse_the_mlx_prompt_cache(mlx16: MlxModel, gemma_mlx16: Path) -> None:
    sampling = SamplingParams(temperature=0, max_tokens=8)
    chat = ChatSession(mlx16, "gemma-mlx", BUILTIN_TEMPLATES["gemma"], "gemma", sampling)
    "".join(e.text for e in chat.reply("What is the capital of France?") if isinstance(e, Token))
    first = chat.last
    assert first is not None and first.stats is not None
    second = "".join(e.text for e in chat.reply("And of Italy?") if isinstance(e, Token))
    assert mlx16.reused == first.prompt_tokens + first.stats.generated_tokens
    ids = conversation_ids(mlx16, chat.template, chat.messages()[:-1])
    fresh = MlxBackend().load(gemma_mlx16, LoadParams(1024, 2, 0))
    try:
        expected = "".join(e.text for e in fresh.stream(ids, sampling) if isinstance(e, Token))
    finally:
        fresh.close()
    assert second == expected


def test_quantized_and_rotating_kv_caches(gemma_mlx16: Path) -> None:
    from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache

    greedy = SamplingParams(temperature=0, max_tokens=4)
    model = MlxBackend().load(gemma_mlx16, LoadParams(1024, 2, 0, kv_type="q8_0"))
    try:
        ids = model.tokenize("The capital of France is", add_bos=True)
        assert [e for e in model.stream(ids, greedy) if isinstance(e, Token)]
        cache = model._cache
        assert cache is not None
        assert isinstance(cache[5], QuantizedKVCache) and cache[5].bits == 8  # every sixth layer is global
        assert isinstance(cache[0], RotatingKVCache)  # sliding-window layers stay as mlx-lm makes them
    finally:
        model.close()
    rotating = MlxBackend().load(gemma_mlx16, LoadParams(1024, 2, 0, max_kv_size=32))
    try:
        long_prompt = rotating.tokenize(TEXT[:400], add_bos=True)
        assert len(long_prompt) > 32
        assert [e for e in rotating.stream(long_prompt, greedy) if isinstance(e, Token)]
        cache = rotating._cache
        assert cache is not None and isinstance(cache[5], RotatingKVCache) and cache[5].max_size == 32
    finally:
        rotating.close()


# --- the CLI with --backend mlx ------------------------------------------------------


def test_run_with_mlx_backend_matches_gguf(gemma: Path, gemma_mlx16: Path) -> None:
    args = ["run", "The capital of France is", "-t", "0", "-n", "8", "--raw", "--json"]
    code, out, err = invoke([*args, "-m", str(gemma_mlx16), "--backend", "mlx"])
    assert code == 0, err
    mlx = json.loads(out)
    assert mlx["backend"] == "mlx" and mlx["backend_reason"] == "--backend mlx"
    code, out, err = invoke([*args, "-m", str(gemma)])
    assert code == 0, err
    gguf = json.loads(out)
    assert gguf["backend"] == "gguf" and gguf["backend_reason"] == "auto: the model is a GGUF file"
    assert mlx["text"] == gguf["text"] and mlx["tokens"] == gguf["tokens"]


def test_chat_and_inspection_commands_on_mlx(gemma_mlx16: Path) -> None:
    result = llmrun(["chat", "-m", str(gemma_mlx16), "-t", "0", "-n", "6", "--no-history"], stdin="Hello!\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "Traceback" not in result.stderr
    code, out, err = invoke(["tokenize", "안녕하세요 🦜", "-m", str(gemma_mlx16), "--json"])
    assert code == 0, err
    assert json.loads(out)["count"] >= 3
    code, out, err = invoke(["next", "The capital of France is", "-m", str(gemma_mlx16), "--raw", "--json"])
    assert code == 0, err
    assert json.loads(out)["candidates"][0]["piece"].strip()
    code, out, err = invoke(["show", str(gemma_mlx16), "--json"])
    assert code == 0, err
    facts = json.loads(out)
    assert facts["backend"] == "mlx" and facts["architecture"] == "gemma3"


def test_backend_mismatches_are_one_clear_line(gemma: Path, gemma_mlx16: Path) -> None:
    code, _, err = invoke(["run", "hi", "-m", str(gemma_mlx16), "--backend", "gguf"])
    assert code == 2 and "no GGUF form" in err and "--backend mlx" in err
    code, _, err = invoke(["run", "hi", "-m", str(gemma), "--backend", "mlx"])
    assert code == 2 and f"llmrun convert {gemma} --to mlx" in err
    code, _, err = invoke(["run", "hi", "-m", str(gemma), "--max-kv-size", "64"])
    assert code == 2 and "--ctx" in err
    assert "Traceback" not in err


def test_convert_refuses_bad_input_and_leaves_nothing(gemma: Path, tmp_path: Path) -> None:
    from tests import ggufbuild

    existing = tmp_path / "out"
    existing.mkdir()
    code, _, err = invoke(["convert", str(gemma), "-o", str(existing)])
    assert code == 2 and "already exists" in err and "--force" in err
    code, _, err = invoke(["convert", str(gemma), "--bits", "3", "-o", str(tmp_path / "x")])
    assert code == 2 and "--bits must be one of 4, 8, 16" in err
    falcon = ggufbuild.write(tmp_path / "falcon.gguf", {**ggufbuild.HUGE_META, "general.architecture": "falcon"})
    code, _, err = invoke(["convert", str(falcon), "-o", str(tmp_path / "y")])
    assert code == 2 and "gemma3, llama, qwen2" in err
    code, _, err = invoke(["convert", str(tmp_path / "missing.gguf")])
    assert code == 1 and "does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("falcon", "out", "x", "y", "."))) == [
        "falcon.gguf",
        "out",
    ]
    assert not list(existing.iterdir())
