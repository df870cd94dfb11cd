"""tokenize, next, --show-probs/--logprobs, show and bench on the real Gemma model."""

from __future__ import annotations

import ctypes
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.helpers import invoke, llmrun

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


def json_of(*args: str) -> Any:
    code, out, err = invoke([*args, "--json"])
    assert code == 0, err
    return json.loads(out)


def test_tokenize_groups_split_characters_and_round_trips(gemma: Path) -> None:
    text = "안녕하세요, world 🦜 𓀀"
    result = json_of("tokenize", text)
    assert result["tokens"][0]["piece"] == "<bos>"
    assert "".join(s["text"] for s in result["spans"][1:]) == text
    hieroglyph = [s for s in result["spans"] if s["text"] == "𓀀"]
    assert hieroglyph and hieroglyph[0]["byte_fallback"] and len(hieroglyph[0]["ids"]) == 4
    assert bytes(b for t in result["tokens"][1:] for b in t["bytes"]).decode() == text
    assert result["count"] == len(result["tokens"]) == 11
    assert result["characters_per_token"] == pytest.approx(len(text) / 10, abs=1e-3)
    no_bos = json_of("tokenize", "--no-bos", text)
    assert no_bos["count"] == 10
    special = json_of("tokenize", "--no-bos", "--special", "<start_of_turn>")
    assert special["count"] == 1
    assert json_of("tokenize", "--no-bos", "<start_of_turn>")["count"] > 1  # typed markup is text


def test_tokenize_in_a_pipe_is_a_plain_table(gemma: Path) -> None:
    result = llmrun(["tokenize", "𓀀 ok"])
    assert result.returncode == 0 and "\x1b" not in result.stdout
    assert "<0xF0>" in result.stdout and "byte (part of a character)" in result.stdout
    assert "characters per token" in result.stderr


def test_next_shows_each_stage(gemma: Path) -> None:
    result = json_of("next", PROMPT, "-t", "0.7", "--top-k", "3", "--top", "6")
    rows = result["candidates"]
    assert [r["rank"] for r in rows] == list(range(1, 7))
    assert [r["raw"] for r in rows] == sorted((r["raw"] for r in rows), reverse=True)
    assert result["survivors"] == 3
    assert [r["removed_by"] for r in rows[3:]] == ["top-k"] * 3
    assert sum(r["final"] for r in rows[:3]) == pytest.approx(1.0)
    assert rows[0]["tempered"] > rows[0]["raw"]  # T < 1 sharpens
    assert result["entropy_bits"]["final"] < result["entropy_bits"]["raw"]
    greedy = json_of("next", PROMPT, "-t", "0")
    assert greedy["survivors"] == 1 and greedy["candidates"][0]["final"] == 1.0
    first = json_of("run", "-t", "0", "-n", "1", PROMPT)["text"]
    assert greedy["candidates"][0]["piece"] == first


def test_next_table_in_a_pipe(gemma: Path) -> None:
    result = llmrun(["next", PROMPT, "--top-k", "2", "--top", "4"])
    assert result.returncode == 0 and "\x1b" not in result.stdout
    assert "top-k" in result.stdout and "raw p" in result.stdout
    assert "2 of 262,144 tokens survive" in result.stderr


def test_reference_filters_match_llama_cpp_sampler_chain(gemma: Path) -> None:
    """Our one implementation of the filters agrees with llama.cpp's own chain on real logits."""
    import llama_cpp
    from llama_cpp._internals import LlamaSampler

    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.decoding.sampling import SamplingParams, sampling_stages

    model = GgufBackend().load(gemma, LoadParams(512, 2, 0))
    try:
        logits = model.logits(model.tokenize(PROMPT, add_bos=True))
    finally:
        model.close()
    for params in (
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.3, top_k=0, top_p=0.5, min_p=0.0),
        SamplingParams(temperature=0.9, top_k=100, top_p=1.0, min_p=0.1),
    ):
        ours = sampling_stages(logits, params).final
        chain = LlamaSampler()
        chain.add_top_k(params.top_k)
        chain.add_top_p(params.top_p, 1)
        chain.add_min_p(params.min_p, 1)
        chain.add_temp(params.temperature)
        data = (llama_cpp.llama_token_data * logits.size)()
        view = np.frombuffer(data, dtype=np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)]))
        view["id"] = np.arange(logits.size)
        view["logit"] = logits
        candidates = llama_cpp.llama_token_data_array(data=data, size=logits.size, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(chain.sampler, ctypes.byref(candidates))
        kept = view[: candidates.size]
        theirs = np.zeros_like(ours)
        scaled = kept["logit"].astype(np.float64)
        theirs[kept["id"]] = np.exp(scaled - scaled.max()) / np.exp(scaled - scaled.max()).sum()
        assert set(np.nonzero(ours)[0]) == set(kept["id"].tolist()), params
        assert np.allclose(ours, theirs, atol=1e-5), params


def test_logprobs_in_json_and_show_probs(gemma: Path) -> None:
    result = json_of("run", "-t", "0", "-n", "4", "--logprobs", "3", PROMPT)
    steps = result["logprobs"]
    assert len(steps) == 4
    assert "".join(step["token"] for step in steps) == result["text"]
    for step in steps:
        assert step["top"][0]["id"] == step["id"]  # greedy picks the most likely
        assert step["logprob"] == pytest.approx(step["top"][0]["logprob"])
        assert len(step["top"]) == 3 and step["logprob"] <= 0
    nxt = json_of("next", PROMPT, "-t", "0")["candidates"][0]
    assert math.exp(steps[0]["logprob"]) == pytest.approx(nxt["raw"], rel=1e-4)
    piped = llmrun(["run", "-t", "0", "-n", "12", "--show-probs", PROMPT])
    plain = llmrun(["run", "-t", "0", "-n", "12", PROMPT])
    assert piped.returncode == 0 and piped.stdout == plain.stdout
    assert "\x1b" not in piped.stdout and "token probability" in piped.stderr


def test_show_memory_plan_matches_llama_cpp_kv_size(gemma: Path, caplog: pytest.LogCaptureFixture) -> None:
    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend

    facts = json_of("show", "--ctx", "2048")
    assert facts["architecture"] == "gemma3" and facts["context_length"] == 32768
    assert facts["sliding_window"] == {"window": 512, "layers": 15}
    assert facts["chat_template"] is False and facts["license"] == "gemma"
    assert facts["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert 250e6 < facts["parameters"] < 300e6
    assert sum(t["bytes"] for t in facts["tensor_types"].values()) < facts["file_size"]
    plans = facts["memory_plan"]["by_kv_type"]
    for kv in ("f16", "q8_0"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="llmrun.llama_cpp"):
            GgufBackend().load(gemma, LoadParams(2048, 2, 0, kv_type=kv)).close()
        sizes = [float(m) for m in re.findall(r"llama_kv_cache: size =\s+([\d.]+) MiB", caplog.text)]
        reported = sum(sizes) * 1024 * 1024
        assert sizes and abs(plans[kv]["kv_cache_bytes"] - reported) <= 0.10 * reported, (kv, sizes)
    assert plans["q4_0"]["kv_cache_bytes"] < plans["q8_0"]["kv_cache_bytes"] < plans["f16"]["kv_cache_bytes"]
    from llmrun.formats.gguf_header import read_header
    from llmrun.formats.memory import plan
    from llmrun.sysinfo import available_memory

    whole = plan(read_header(gemma), 32768, "f16").total_bytes  # the whole trained context
    if whole < 0.8 * available_memory():  # with room to spare for what other processes do meanwhile
        assert plans["f16"]["largest_context"] == 32768
    else:  # a small machine: the plan stops short of it
        assert 0 < plans["f16"]["largest_context"] < 32768
    result = llmrun(["show"])
    assert result.returncode == 0 and "memory plan at 4,096 tokens" in result.stdout


def test_bench_reports_medians_and_spread(gemma: Path) -> None:
    rows = json_of("bench", "-p", "32", "-n", "8", "-r", "2", "--kv-type", "f16,q8_0")
    assert [r["kv_type"] for r in rows] == ["f16", "q8_0"]
    for row in rows:
        assert row["n_prompt"] == 32 and row["n_gen"] == 8 and row["repetitions"] == 2
        assert row["pp_tokens_per_s"] > row["tg_tokens_per_s"] > 0
        assert 0 < row["ttft_s"] < 5 and row["peak_rss_bytes"] > 100 * 1024 * 1024
    code, out, _ = invoke(["bench", "-p", "16", "-n", "4", "-r", "1", "--csv"])
    assert code == 0 and out.splitlines()[0].startswith("model,backend,kv_type")
    code, _, err = invoke(["bench", "--kv-type", "f8"])
    assert code == 2 and "choose from f16, q8_0, q4_0" in err
