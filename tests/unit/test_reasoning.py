"""Reasoning apart from the answer: markers chosen by template, streamed splits equal whole splits."""

from __future__ import annotations

import random

import pytest

from llmrun.decoding.events import Token
from llmrun.decoding.reasoning import KNOWN_MARKERS, Markers, Splitter, Thinking, markers_for, split, thinking_for

THINK = Markers("<think>", "</think>")


def streamed(thinking: Thinking, chunks: list[str]) -> tuple[str, str, bool]:
    splitter = Splitter(thinking)
    parts = [splitter.feed(c) for c in chunks] + [splitter.finish()]
    return "".join(r for r, _ in parts), "".join(a for _, a in parts), splitter.reasoned


@pytest.mark.parametrize(
    ("text", "started", "reasoning", "answer"),
    [
        ("<think>\nLet me see.\n</think>\n\nParis.", False, "Let me see.", "Paris."),
        ("  <think>a</think>b", False, "a", "b"),
        ("Paris.", False, None, "Paris."),
        ("Paris. <think>not at the start</think>", False, None, "Paris. <think>not at the start</think>"),
        ("\nweighing\n</think>\n\nParis.", True, "weighing", "Paris."),  # DeepSeek R1: the prompt opened it
        ("still weighing", True, "still weighing", ""),  # cut before the close marker
        ("<think>\n\n</think>\n\nParis.", False, "", "Paris."),  # reasoning turned off: an empty block
        ("<thi", False, None, "<thi"),  # a marker never finished is answer text
        ("", False, None, ""),
    ],
)
def test_split(text: str, started: bool, reasoning: str | None, answer: str) -> None:
    assert split(Thinking(THINK, started), text) == (reasoning, answer)


def test_no_markers_no_split() -> None:
    assert split(None, "<think>x</think>y") == (None, "<think>x</think>y")


@pytest.mark.parametrize("markers", KNOWN_MARKERS)
@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_streams_what_the_whole_text_splits_into(markers: Markers, seed: int) -> None:
    rng = random.Random(seed)
    body = f"\n step 1 \n\n step {markers.close[:3]} 2\n"
    text = f" {markers.open}{body}{markers.close}\n\n The answer: 42. {markers.open}"
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    thinking = Thinking(markers)
    reasoning, answer, reasoned = streamed(thinking, chunks)
    assert (reasoning if reasoned else None, answer) == split(thinking, text)
    assert reasoning == f"step 1 \n\n step {markers.close[:3]} 2"
    assert answer == f"The answer: 42. {markers.open}"


def test_a_marker_split_across_tokens_is_held_back_not_shown() -> None:
    splitter = Splitter(Thinking(THINK))
    assert splitter.feed("<") == ("", "")
    assert splitter.feed("think>plan") == ("plan", "")
    assert splitter.feed(" more</th") == (" more", "")
    assert splitter.feed("ink>Answer") == ("", "Answer")


def test_tokens_carry_their_parts() -> None:
    splitter = Splitter(Thinking(THINK, started=True))
    first = splitter.token(Token(7, "idea</think>Hi", logprob=-0.5))
    assert (first.id, first.reasoning, first.text, first.logprob) == (7, "idea", "Hi", -0.5)
    assert splitter.flush() is None


def test_markers_come_from_the_template() -> None:
    assert markers_for("{{ content.split('</think>')[-1] }}") == THINK
    assert markers_for("[THINK]{{ m.reasoning_content }}[/THINK]") == Markers("[THINK]", "[/THINK]")
    assert markers_for("<|im_start|>{{ m.content }}<|im_end|>") is None


def test_the_prompt_says_whether_reasoning_is_open() -> None:
    template = "…</think>…"
    assert thinking_for(template, "<｜Assistant｜><think>\n") == Thinking(THINK, True)
    assert thinking_for(template, "<|im_start|>assistant\n<think>\n\n</think>\n\n") == Thinking(THINK, False)
    assert thinking_for(template, "<|im_start|>assistant\n") == Thinking(THINK, False)
    assert thinking_for("no markers", "<think>") is None
