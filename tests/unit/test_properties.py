"""Properties of the pure pieces, checked on generated inputs (hypothesis): the sampling filters, the
chunker, the memory plan, model names, the ordered batch writer, and the GGUF reader against the
`gguf` package's writer."""

from __future__ import annotations

import io
import itertools
import json
import math
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmrun.api.batch import OrderedWriter
from llmrun.backends.base import KV_TYPES
from llmrun.decoding import sampling
from llmrun.errors import LlmrunError
from llmrun.formats.gguf_header import GgufHeader, read_header
from llmrun.formats.memory import plan
from llmrun.models.refs import ModelRef
from llmrun.rag.chunking import chunk_lines

probabilities = (
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=64)
    .filter(lambda xs: sum(xs) > 1e-6)
    .map(lambda xs: np.array(xs, dtype=np.float64) / sum(xs))
)


@given(probabilities, st.integers(0, 80), st.floats(0.01, 1.0), st.floats(0.0, 1.0))
def test_filters_only_remove_and_keep_a_distribution(p: np.ndarray, k: int, top_p: float, min_p: float) -> None:
    for filtered in (sampling.top_k_filter(p, k), sampling.top_p_filter(p, top_p), sampling.min_p_filter(p, min_p)):
        assert np.all((filtered == 0) | (filtered == p))  # a filter keeps a token as it is, or drops it
        assert filtered.max() == p.max()  # the most probable token always survives
        renormalized = sampling.renormalize(filtered)
        assert math.isclose(renormalized.sum(), 1.0, rel_tol=1e-9) and np.all(renormalized >= 0)
    if 0 < k < p.size:
        assert np.count_nonzero(sampling.top_k_filter(p, k)) <= k


@given(probabilities)
def test_top_p_keeps_the_smallest_prefix_reaching_p(p: np.ndarray) -> None:
    kept = sampling.top_p_filter(p, 0.5)
    assert kept.sum() >= 0.5 - 1e-9
    smallest = kept[kept > 0].min()
    assert kept.sum() - smallest < 0.5 + 1e-9  # without its least likely token it would fall short


@given(st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=32))
def test_temperature_towards_zero_tends_to_greedy(logits: list[float]) -> None:
    x = np.array(logits)
    best = np.flatnonzero(x == x.max())
    masses = [sampling.softmax(sampling.apply_temperature(x, t))[best].sum() for t in (2.0, 1.0, 0.5, 0.1, 0.01)]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(masses))  # colder: more on the best
    runner_up = np.max(x[x < x.max()]) if np.any(x < x.max()) else -np.inf
    if x.max() - runner_up >= 0.2:  # a clear best: at T = 0.01 all but e^-20 of the mass
        assert masses[-1] > 1 - 1e-6 * x.size


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=40), st.integers(8, 64))
def test_chunks_cover_the_text_in_order_within_the_limit(sizes: list[int], max_tokens: int) -> None:
    def count(text: str) -> int:
        return len(text.split())

    counter = iter(range(10**6))
    lines = [" ".join(f"w{next(counter)}" for _ in range(n)) for n in sizes]  # every word its own
    chunks = chunk_lines(list(enumerate(lines, start=1)), count, max_tokens=max_tokens, overlap=max_tokens // 4)
    seen: list[str] = []
    for chunk in chunks:
        assert count(chunk.text) <= max_tokens
        assert 1 <= chunk.start <= chunk.end <= len(lines)
        tokens = chunk.text.split()
        assert tokens, "an empty chunk"
        overlap = seen.index(tokens[0]) if tokens[0] in seen else len(seen)
        assert seen[overlap:] == tokens[: len(seen) - overlap]  # it starts with the end of the previous one
        assert len(seen) - overlap <= max_tokens // 4  # the overlap stays within its budget
        seen += tokens[len(seen) - overlap :]
    assert seen == [w for line in lines for w in line.split()]  # every word, once, in order
    assert [c.start for c in chunks] == sorted(c.start for c in chunks)


def header(n_layers: int, context: int) -> GgufHeader:
    metadata = {
        "general.architecture": "llama",
        "llama.block_count": n_layers,
        "llama.context_length": context,
        "llama.embedding_length": 256,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
    }
    return GgufHeader(Path("m.gguf"), 3, metadata, (), 0, 1000)


@given(st.integers(1, 48), st.integers(16, 8192), st.integers(16, 8192))
def test_the_memory_plan_grows_with_context_and_kv_precision(n_layers: int, a: int, b: int) -> None:
    small, large = sorted((a, b))
    h = header(n_layers, 8192)
    for kv in KV_TYPES:
        assert plan(h, small, kv).total_bytes <= plan(h, large, kv).total_bytes
    by_type = [plan(h, large, kv).kv_bytes for kv in ("q4_0", "q8_0", "f16")]
    assert by_type == sorted(by_type)


part = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,11}", fullmatch=True).filter(lambda s: ".." not in s)
names = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9._-]{0,10}(:[a-z0-9][a-z0-9._-]{0,6})?", fullmatch=True),
    st.builds(lambda o, r, q: f"{o}/{r}" + (f":{q}" if q else ""), part, part, st.sampled_from(["", "q4_k_m", "Q8_0"])),
    st.builds(lambda o, r, f: f"hf.co/{o}/{r}/{f}.gguf", part, part, part),
    st.builds(lambda n: f"ollama:{n}", part),
    st.builds(lambda n: f"./models/{n}.gguf", part),
)


@given(names)
def test_a_model_name_parses_back_from_its_canonical_form(text: str) -> None:
    try:
        ref = ModelRef.parse(text)
    except LlmrunError:
        return  # refused names are refused with one line; nothing to round-trip
    again = ModelRef.parse(ref.canonical())
    assert (again.kind, again.name, again.tag, again.file) == (ref.kind, ref.name, ref.tag, ref.file)
    assert again.canonical() == ref.canonical()


@given(st.permutations(list(range(12))), st.sets(st.integers(0, 11), max_size=4))
def test_the_batch_writer_writes_input_order_whatever_the_completion_order(order: list[int], failed: set[int]) -> None:
    out = io.StringIO()
    ids = [f"id{i}" for i in range(12)]
    writer = OrderedWriter(out, ids)
    for i in order:
        writer.add(ids[i], None if i in failed else {"id": ids[i]})
    written = [json.loads(line)["id"] for line in out.getvalue().splitlines()]
    assert written == [ids[i] for i in range(12) if i not in failed]


metadata_values = st.one_of(
    st.integers(0, 2**31 - 1),
    st.floats(-1e6, 1e6, allow_nan=False, width=32),
    st.text(min_size=1, max_size=40),  # the writer drops empty strings
    st.booleans(),
    st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=8),
    st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=8),
)


@settings(deadline=None, max_examples=60)
@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_.]{0,20}", fullmatch=True), metadata_values, max_size=10))
def test_gguf_written_by_the_gguf_package_reads_back_equal(metadata: dict[str, object]) -> None:
    from gguf import GGUFWriter

    metadata.pop("general.architecture", None)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.gguf"
        writer = GGUFWriter(path, "llama")
        for key, value in metadata.items():
            if isinstance(value, bool):
                writer.add_bool(key, value)
            elif isinstance(value, int):
                writer.add_uint32(key, value)
            elif isinstance(value, float):
                writer.add_float32(key, value)
            elif isinstance(value, str):
                writer.add_string(key, value)
            else:
                writer.add_array(key, value)
        writer.add_tensor("output.weight", np.zeros((2, 32), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        read = read_header(path)
    assert read.architecture == "llama"
    for key, value in metadata.items():
        got = read.metadata[key]
        if isinstance(value, float):
            assert math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-30)
        elif isinstance(value, list) and not isinstance(got, list):
            assert getattr(got, "count", None) == len(value)  # long arrays are read as a summary
        else:
            assert got == value, key
    assert [t.name for t in read.tensors] == ["output.weight"] and read.tensors[0].shape == (32, 2)
