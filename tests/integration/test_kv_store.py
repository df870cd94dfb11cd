"""The KV store on the real models: a prefix is paid for once, in a later process too — run, chat, batch —
with the saver's own numbers (bit for bit without a sliding window, up to rounding with one), and a
damaged file is removed with a note, never loaded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmrun.backends.base import LoadParams
from llmrun.backends.gguf import GgufBackend, GgufModel
from llmrun.backends.gguf_state import seq_state, set_seq_state
from llmrun.models.kv_store import MIN_SAVE, entries, store_dir
from tests.support.helpers import invoke

pytestmark = pytest.mark.slow  # a model load per CLI call; the store's own rules are in tests/unit/test_kv_store.py

WORDS = [
    *("the", "river", "keeper", "lamp", "night", "town", "harbour", "boat"),
    *("stone", "bridge", "market", "winter", "bell", "road", "tower", "garden"),
]
DOCUMENT = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(700))  # about 700 tokens


def run_json(*args: str) -> dict[str, Any]:
    code, out, err = invoke(["run", "-t", "0", "-n", "6", "--json", *args])
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def kept() -> list[int]:
    return sorted(len(entry.tokens) for entry in entries())


def test_a_second_run_starts_from_the_kept_prompt(smollm: Path) -> None:
    """SmolLM2 has no sliding window: the restored cells are the saver's, bit for bit (see the numerics
    below), so the second answer is the first, exactly."""
    prompt_text = f"{DOCUMENT[:2000]} Question: which word comes first?"
    first = run_json("-m", str(smollm), prompt_text)
    assert first["tokens"]["cached"] == 0
    prompt = first["tokens"]["prompt"]
    assert kept() == [prompt - 1]  # the prompt less its last token, which is evaluated for its logits
    second = run_json("-m", str(smollm), prompt_text)
    assert second["tokens"]["cached"] == prompt - 1
    assert second["text"] == first["text"]
    assert kept() == [prompt - 1]  # nothing new to keep


def test_a_new_question_after_the_same_document_learns_where_the_document_ends(gemma: Path) -> None:
    """Gemma's sliding window: a kept prompt is used whole, so the document's end is kept as its own entry
    when a second question leaves the first; the third question starts there."""
    run_json(f"{DOCUMENT} Question: which word comes first?")
    second = run_json(f"{DOCUMENT} Question: is there a bridge?")
    assert second["tokens"]["cached"] == 0
    document_end = min(kept())
    assert second["tokens"]["prompt"] - document_end < 12  # the question (and its template) only
    third = run_json(f"{DOCUMENT} Question: how many towers?")
    assert third["tokens"]["cached"] == document_end


def test_no_kv_cache_and_a_zero_size_keep_nothing(gemma: Path) -> None:
    run_json("--no-kv-cache", DOCUMENT)
    run_json("--kv-cache-size", "0", DOCUMENT)
    assert kept() == []
    code, _, err = invoke(["run", "--kv-cache-size", "lots", "hello"])
    assert code == 2 and "not a size: 'lots'" in err


@pytest.mark.parametrize("damage", ["flip a byte", "truncate"])
def test_a_damaged_file_is_removed_with_a_note_and_the_prompt_evaluated(gemma: Path, damage: str) -> None:
    first = run_json(DOCUMENT)
    (entry,) = list(entries())
    data = bytearray(entry.path.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2 :]
    else:
        data[-1000] ^= 0x40
    entry.path.write_bytes(bytes(data))
    code, out, err = invoke(["run", "-t", "0", "-n", "6", "--json", DOCUMENT])
    assert code == 0
    assert "KV cache: removed" in err and "evaluated again" in err
    again = json.loads(out)
    assert again["tokens"]["cached"] == 0 and again["text"] == first["text"]
    assert kept() == [first["tokens"]["prompt"] - 1]  # kept anew, whole


def test_cache_ls_rm_and_clear(gemma: Path) -> None:
    run_json(DOCUMENT)
    code, out, _ = invoke(["cache", "ls", "--json"])
    listing = json.loads(out)
    assert code == 0 and [e["model"] for e in listing["entries"]] == ["gemma3:270m"]
    assert listing["directory"] == str(store_dir()) and listing["bytes"] > 0
    code, out, _ = invoke(["cache", "ls"])
    assert "gemma3:270m" in out and listing["entries"][0]["id"] in out
    code, _, err = invoke(["cache", "rm", "nothing-like-this"])
    assert code == 2 and "nothing in the KV store matches" in err
    code, _, err = invoke(["cache", "rm", listing["entries"][0]["id"]])
    assert code == 0 and "removed 1 prefix" in err and kept() == []
    run_json(DOCUMENT)
    code, _, err = invoke(["cache", "clear"])
    assert code == 0 and "removed 1 prefix" in err and kept() == []


def test_a_saved_chat_comes_back_without_its_prefill(smollm: Path) -> None:
    first = f"Here is a text: {DOCUMENT[:1600]}. Remember it."
    code, _, err = invoke(
        ["chat", "-m", str(smollm), "-t", "0", "-n", "12"], stdin=f"{first}\nThe first word?\n/save notes\n"
    )
    assert code == 0, err
    conversation = max(kept())
    assert conversation > MIN_SAVE and len(kept()) == 1  # the second turn's cells replaced the first's
    code, out, err = invoke(
        ["chat", "-m", str(smollm), "-t", "0", "-n", "12"], stdin="/load notes\nAnd the second word?\n/stats\n"
    )
    assert code == 0, err
    reused = [line for line in (out + err).splitlines() if "reused from the KV cache" in line]
    assert reused and f"({conversation} reused" in reused[-1]


def test_batch_evaluates_the_shared_preamble_once_then_takes_it_from_the_store(smollm: Path, tmp_path: Path) -> None:
    """On SmolLM2 (no sliding window) the cells restored from the store are the evaluated ones, bit for bit:
    the second batch answers exactly as the first."""
    prompts = tmp_path / "prompts.jsonl"
    questions = ["first word?", "last word?", "is it winter?"]
    prompts.write_text("".join(json.dumps({"prompt": f"{DOCUMENT} Question: {q}"}) + "\n" for q in questions))

    def batch(output: str) -> list[dict[str, Any]]:
        args = ["batch", str(prompts), "-m", str(smollm), "-t", "0", "-n", "6", "-o", str(tmp_path / output)]
        code, _, err = invoke(args)
        assert code == 0, err
        return [json.loads(line) for line in (tmp_path / output).read_text().splitlines()]

    first = batch("one.jsonl")
    shared = {line["tokens"]["cached"] for line in first}
    assert len(shared) == 1 and shared.pop() > 600  # the document, evaluated once and copied to each sequence
    assert kept() == [first[0]["tokens"]["cached"]]
    second = batch("two.jsonl")
    assert [line["text"] for line in second] == [line["text"] for line in first]
    assert [line["tokens"]["cached"] for line in second] == [line["tokens"]["cached"] for line in first]


# --- numerics: the restored cells are the saver's ----------------------------------------------


@pytest.fixture(scope="module")
def models(gemma_cache: Path, smollm: Path) -> Iterator[dict[str, Path]]:
    yield {"gemma (sliding window)": gemma_cache, "smollm2": smollm}


def _logits(model: GgufModel) -> Any:
    return np.array(model._last_logits(), dtype=np.float64)


def _log_softmax(x: Any) -> Any:
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def _kl(p: Any, q: Any) -> float:
    lp, lq = _log_softmax(p), _log_softmax(q)
    return float((np.exp(lp) * (lp - lq)).sum())


@pytest.mark.parametrize("name", ["gemma (sliding window)", "smollm2"])
def test_a_restored_prefix_gives_the_savers_logits(models: dict[str, Path], name: str) -> None:
    """The saver's next-token logits after the prefix, against (a) a process that restored its cells and
    (b) a fresh evaluation of the whole prompt. Without a sliding window the restored cells land where the
    saver had them: the same logits, bit for bit. Gemma's restored window lands in other cells of the cache,
    which sums in another order: equal up to rounding, as close as a fresh evaluation is."""

    def load() -> GgufModel:
        return GgufBackend().load(models[name], LoadParams(2048, 2, 0))

    saver = load()
    ids = saver.tokenize(DOCUMENT * 2, add_bos=True)[:1001]
    n = 1000
    saver.llama.eval(ids[:n])
    state = seq_state(saver.llama._ctx.ctx, 0)
    saver.llama.eval(ids[n:])
    want = _logits(saver)
    saver.close()

    restorer = load()
    assert set_seq_state(restorer.llama._ctx.ctx, 0, state)
    restorer.llama.n_tokens = n
    restorer.llama.input_ids[:n] = ids[:n]
    restorer.llama.eval(ids[n:])
    restored = _logits(restorer)
    restorer.close()

    fresh_model = load()
    fresh_model.llama.eval(ids)
    fresh = _logits(fresh_model)
    fresh_model.close()

    if name == "smollm2":
        assert np.array_equal(restored, want)
    else:
        assert _kl(want, restored) < 0.01 and _kl(want, fresh) < 0.01
        assert int(np.argmax(restored)) == int(np.argmax(want))
    assert not np.array_equal(fresh, want) or name == "smollm2"  # a fresh evaluation rounds differently


def test_cells_from_another_model_are_refused_and_the_sequence_left_empty(models: dict[str, Path]) -> None:
    gemma = GgufBackend().load(models["gemma (sliding window)"], LoadParams(1024, 2, 0))
    gemma.llama.eval(gemma.tokenize(DOCUMENT, add_bos=True)[:300])
    state = seq_state(gemma.llama._ctx.ctx, 0)
    gemma.close()
    smol = GgufBackend().load(models["smollm2"], LoadParams(1024, 2, 0))
    try:
        assert not set_seq_state(smol.llama._ctx.ctx, 0, state)
        import llama_cpp

        assert llama_cpp.llama_memory_seq_pos_max(smol.llama._ctx.memory, 0) == -1
    finally:
        smol.close()


# --- MLX: mlx-lm's prompt-cache files as the payload ---------------------------------------------


def test_mlx_keeps_its_prompt_cache_and_a_new_model_starts_from_it(
    gemma_mlx8: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mlx-lm's own cache, saved and loaded whole (Gemma's sliding layers are rotating caches, used whole):
    the second model, a new load as a new process would make, evaluates only the last prompt token. MLX's
    prefill on a CPU takes seconds a hundred tokens, so the store keeps short prefixes for this test."""
    monkeypatch.setattr("llmrun.models.kv_store.MIN_SAVE", 40)
    from llmrun.backends.mlx import MlxBackend
    from llmrun.decoding.events import Done, Token
    from llmrun.decoding.sampling import SamplingParams
    from llmrun.engine.load import attach_kv_store

    params = LoadParams(2048, 2, 0)

    def answer() -> tuple[list[int], Done]:
        model = MlxBackend().load(gemma_mlx8, params)
        try:
            attach_kv_store(model, "gemma-mlx", params, 10**9)
            ids = model.tokenize(" ".join(DOCUMENT.split()[:60]), add_bos=True)
            events = list(model.stream(ids, SamplingParams(temperature=0, max_tokens=3)))
        finally:
            model.close()
        done = events[-1]
        assert isinstance(done, Done)
        return [e.id for e in events if isinstance(e, Token)], done

    first, first_done = answer()
    assert first_done.stats.cached_tokens == 0
    assert kept() == [first_done.stats.prompt_tokens - 1]
    second, second_done = answer()
    assert second_done.stats.cached_tokens == first_done.stats.prompt_tokens - 1
    assert second == first
