"""The pure pieces of ``llmrun look``: top-k over vocabulary chunks, reading attention maps, the JSON shape
and the page's embedding of it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from llmrun.backends import trace as trace_module
from llmrun.backends.trace import ATTENTION_BUDGET, Geometry, TopKAccumulator, attention_layers, top_k
from llmrun.errors import UsageError
from llmrun.look import attention as reading
from llmrun.look.page import embedded_json, page
from llmrun.look.report import to_json
from llmrun.look.view import Look, Neighbour, Token, positions_line

GEOMETRY = Geometry("gemma3", 2, 4, 2, 8, 50, 0, "neox", 1e6)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float32, st.tuples(st.integers(1, 5), st.integers(8, 300)), elements=st.floats(-40, 40, width=32)),
    st.integers(1, 6),
    st.integers(1, 97),
)
def test_top_k_over_chunks_is_the_top_of_the_whole_row(logits: np.ndarray, k: int, chunk: int) -> None:
    k = min(k, logits.shape[1])
    acc = TopKAccumulator(logits.shape[0], k)
    block, trace_module._BLOCK = trace_module._BLOCK, 4  # small blocks: the block search runs on small rows
    try:
        for start in range(0, logits.shape[1], chunk):
            acc.add(start, logits[:, start : start + chunk])
    finally:
        trace_module._BLOCK = block
    got = acc.result()
    probs = softmax(logits.astype(np.float64))
    want = np.sort(probs, axis=1)[:, ::-1][:, :k]
    assert np.allclose(got.probs, want, atol=1e-5)  # ties may name either id; the values must agree
    assert np.allclose(np.take_along_axis(probs, got.ids, axis=1), want, atol=1e-5)


def test_top_k_finds_the_top_in_flat_and_peaked_rows() -> None:
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(4, 50_000)).astype(np.float32) * np.array([[0.01], [3], [30], [300]], dtype=np.float32)
    rows[2, 49_999] = 1e4  # in the columns after the last whole block
    got = top_k(rows, 5)
    assert (np.sort(got.ids, axis=1) == np.sort(np.argsort(-rows, axis=1, kind="stable")[:, :5], axis=1)).all()
    assert (np.diff(got.probs, axis=1) <= 0).all()  # best first


def test_attention_budget_refuses_with_a_way_out() -> None:
    big = Geometry("x", 32, 32, 8, 4096, 32000, 0, "norm", 1e4)
    n = int((ATTENTION_BUDGET / (32 * 32 * 4)) ** 0.5) + 1
    with pytest.raises(UsageError, match="GiB") as refused:
        attention_layers(None, big, n)
    assert "`layer`" in refused.value.hint  # worded as --layer by the CLI
    assert attention_layers([3], big, n) == [3]
    assert attention_layers(None, GEOMETRY, 10) == [0, 1]


def test_reading_an_attention_map() -> None:
    weights = np.zeros((2, 3, 3), dtype=np.float32)
    weights[:, 0, 0] = 1
    weights[0, 1] = [0.2, 0.8, 0]
    weights[1, 1] = [0.6, 0.4, 0]
    weights[0, 2] = [0.1, 0.3, 0.6]
    weights[1, 2] = [0.5, 0.4, 0.1]
    assert np.allclose(reading.head_map(weights, None)[2], [0.3, 0.35, 0.35])
    assert [a.position for a in reading.strongest(weights[0, 2], 2)] == [2, 1]
    assert [a.position for a in reading.strongest(weights[0, 2], 3, upto=2)] == [1, 0]
    assert reading.follow({4: weights}, 1, 1, head=1)[4][0].position == 0
    grid = reading.overview({4: weights, 5: weights}, 2)
    assert [a.position for a in grid[5]] == [2, 0]


def test_leaving_out_the_first_key_rescales_each_row() -> None:
    weights = np.array([[[1, 0, 0], [0.5, 0.5, 0], [0.6, 0.1, 0.3]]], dtype=np.float32)
    rest = reading.without_first({3: weights})[3]
    assert rest[0, 0].tolist() == [1, 0, 0]  # the first query has nothing else to read
    assert rest[0, 1].tolist() == [0, 1, 0]
    assert rest[0, 2] == pytest.approx([0, 0.25, 0.75])
    assert weights[0, 2, 0] == pytest.approx(0.6)  # the captured weights are left as they are


def test_finding_a_token_by_text_or_position() -> None:
    pieces = ["<bos>", "The", " cat", " saw", " the", " cat"]
    assert reading.find_token(pieces, "cat") == 2
    assert reading.find_token(pieces, "cat#2") == 5
    assert reading.find_token(pieces, "THE#2") == 4
    assert reading.find_token(pieces, "#3") == 3
    with pytest.raises(ValueError, match="not a token of the prompt"):
        reading.find_token(pieces, "dog")
    with pytest.raises(ValueError, match="past the prompt"):
        reading.find_token(pieces, "#6")
    with pytest.raises(ValueError):
        reading.find_token(pieces, "cat#3")


def synthetic(n: int = 3) -> Look:
    rng = np.random.default_rng(0)
    attention = {}
    for layer in range(2):
        raw = rng.random((4, n, n)).astype(np.float32) * np.tril(np.ones((n, n), dtype=np.float32))
        attention[layer] = raw / raw.sum(axis=-1, keepdims=True)
    ids = rng.integers(0, 50, size=(2, n, 2))
    probs = np.sort(rng.random((2, n, 2)).astype(np.float32), axis=-1)[..., ::-1] / 2
    tokens = [Token(i, 10 + i, t, 1.0) for i, t in enumerate(["<bos>", "a</script><b", " it"][:n])]
    return Look("m", tokens, GEOMETRY, attention, ids, probs, True, {11: [Neighbour(12, "b", 0.5)]})


def test_the_json_shape() -> None:
    look = synthetic()
    report = to_json(look, lambda i: f"t{i}")
    assert json.loads(json.dumps(report)) == report
    assert [t["id"] for t in report["tokens"]] == [10, 11, 12]
    assert len(report["attention"]) == 2 and len(report["attention"][0]) == 4
    assert [len(q) for q in report["attention"][1][3]] == [1, 2, 3]  # keys 0 … query: causal
    assert report["attention"][1][3][2] == pytest.approx(look.attention[1][3, 2].tolist(), abs=1e-5)
    cell = report["lens"][1][2]
    assert cell["id"] == cell["top"][0]["id"] and len(cell["top"]) == 2 and cell["text"] == f"t{cell['id']}"
    assert report["neighbours"] == {"t11": [{"id": 12, "text": "b", "cosine": 0.5}]}
    look.lens_shown = False
    hidden = to_json(look, str)["lens"]
    assert hidden[0] == [None, None, None] and hidden[1][0] is not None


def test_the_page_carries_the_report_without_escaping_its_script() -> None:
    report = to_json(synthetic(), lambda i: "</script><script>alert(1)</script>")
    text = page(report)
    data = text.split('<script type="application/json" id="data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data) == report
    assert "alert(1)</script>" not in text
    assert "default-src 'none'" in text  # nothing loads from anywhere
    assert "http://" not in text and "https://" not in text
    assert json.loads(embedded_json({"a": "<!--"})) == {"a": "<!--"}


def test_positions_are_described_by_the_geometry() -> None:
    assert "RoPE" in positions_line(GEOMETRY) and "sliding window" not in positions_line(GEOMETRY)
    windowed = Geometry("gemma3", 2, 4, 1, 8, 50, 512, "neox", 1e6)
    assert "last 512 tokens" in positions_line(windowed)
    assert "learned position" in positions_line(Geometry("gpt2", 2, 4, 4, 8, 50, 0, "", 0))
