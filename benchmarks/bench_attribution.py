"""The template attribution (llmrun/prompt/template.py: which special-token strings of a rendered prompt users
wrote) against the character-by-character alignment it replaced, in one run, as ratios.

The conversation is an agent's kind: long turns, earlier reasoning, special-token strings pasted in user
text, rendered by a Qwen3-style template that strips earlier turns' reasoning (so the two renderings differ
near every `</think>`). The baseline (difflib over the whole renderings) is quadratic: it runs only up to
--baseline-limit characters; the new alignment runs at every size, up to a 1,000,000-character prompt.
Goal: about linear time (each doubling of the prompt about doubles the time), and no size at which the
server spends more than a second on it.

Usage: python benchmarks/bench_attribution.py [--baseline-limit 20000]
"""

from __future__ import annotations

import argparse
import difflib
import time

from llmrun.prompt.template import Message, attribute, mark, render_text, special_pattern

TEMPLATE = """{%- for message in messages %}{%- set content = message.content %}
{%- if message.role == 'assistant' and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}<|im_start|>assistant\\n"""
SPECIALS = ("<|im_start|>", "<|im_end|>", "</think>", "<think>")


def conversation(turns: int) -> list[Message]:
    words = " ".join(f"word{i}" for i in range(60))
    messages = []
    for turn in range(turns):
        messages.append(Message("user", f"Question {turn}: {words}\nwith <|im_end|> pasted </think> in it\n"))
        messages.append(Message("assistant", f"<think>\nreasoning {turn} {words}\n</think>\n\nAnswer {turn}."))
    return messages


def baseline(text: str, marked: str) -> None:
    difflib.SequenceMatcher(None, text, marked, autojunk=False).get_matching_blocks()


def timed(function: object, *args: object) -> float:
    started = time.perf_counter()
    function(*args)  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-limit", type=int, default=20_000, help="the largest prompt the baseline aligns")
    limit = parser.parse_args().baseline_limit
    pattern = special_pattern(SPECIALS)
    assert pattern is not None
    print(f"{'characters':>11} {'attribution':>12} {'baseline':>10} {'ratio':>8}")
    turns = 4
    while True:
        messages = conversation(turns)
        text = render_text(TEMPLATE, messages)
        if len(text) > 1_000_000:
            break
        marked = render_text(TEMPLATE, messages, transform=lambda v: mark(v, pattern))
        new = timed(attribute, text, marked, pattern)
        if len(text) <= limit:
            old = timed(baseline, text, marked)
            print(f"{len(text):>11,} {new:>11.4f}s {old:>9.3f}s {old / new:>7.0f}x")
        else:
            print(f"{len(text):>11,} {new:>11.4f}s {'-':>10} {'':>8}")
        turns *= 2


if __name__ == "__main__":
    main()
