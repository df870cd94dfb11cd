"""Speculative decoding's pure half: the draft setting, prompt lookup, and the auto gate."""

from __future__ import annotations

import pytest

from llmrun.errors import InvalidParameter
from llmrun.speculative import DEFAULT_DRAFT_TOKENS, Draft, Gate, PromptLookup, Tally


def test_draft_settings_parse_as_the_flag_spells_them() -> None:
    assert Draft.parse(None) == Draft("off", None, DEFAULT_DRAFT_TOKENS)
    assert Draft.parse("NGRAM", 4) == Draft("ngram", None, 4)
    assert Draft.parse(" auto ").mode == "auto"
    model = Draft.parse("gemma3:270m-q2")
    assert (model.mode, model.model, model.value) == ("model", "gemma3:270m-q2", "gemma3:270m-q2")
    assert Draft.parse("off").value == "off" and not Draft.parse("").on


@pytest.mark.parametrize("tokens", [0, 65, True, 2.5])
def test_draft_tokens_out_of_range_are_refused(tokens: object) -> None:
    with pytest.raises(InvalidParameter) as caught:
        Draft.parse("ngram", tokens)  # type: ignore[arg-type]
    assert caught.value.name == "draft_tokens"


def test_prompt_lookup_copies_what_followed_the_latest_earlier_occurrence() -> None:
    lookup = PromptLookup()
    history = [1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 8, 2, 3, 4]
    # the suffix (2, 3, 4) occurred at 1..3 (then 5) and at 6..8 (then 6, 7, 8): the latest wins
    assert lookup.propose(history, 3) == [6, 7, 8]
    assert lookup.propose(history, 10) == [6, 7, 8, 2, 3, 4]  # the copy may run up to the end
    assert lookup.propose(history, 0) == []


def test_prompt_lookup_falls_back_to_shorter_suffixes_and_finds_nothing_new() -> None:
    lookup = PromptLookup(sizes=(3, 2))
    assert lookup.propose([5, 6, 7, 1, 6, 7], 2) == [1, 6]  # only the 2-gram (6, 7) occurred before
    assert PromptLookup().propose([1, 2, 3, 4, 5], 4) == []  # nothing repeats
    assert PromptLookup().propose([7], 4) == []


def test_prompt_lookup_follows_a_growing_history_and_restarts_on_another() -> None:
    lookup = PromptLookup()
    history = [10, 11, 12, 13, 10, 11]
    assert lookup.propose(history, 2) == [12, 13]
    history += [12, 99, 10, 11, 12]  # grows: indexed incrementally, the latest occurrence now follows with 99
    assert lookup.propose(history, 2) == [99, 10]
    assert lookup.propose([1, 2, 1, 2], 1) == [1]  # not an extension: a fresh index, no stale n-grams
    assert lookup.propose([4, 5, 4, 5], 2) == [4, 5]


def test_prompt_lookup_agrees_with_a_brute_force_search() -> None:
    import random

    rng = random.Random(7)
    lookup = PromptLookup(sizes=(3, 2))
    history: list[int] = []
    for _ in range(400):
        history.append(rng.randrange(6))
        want: list[int] = []
        for n in (3, 2):
            if len(history) <= n:
                continue
            suffix = history[-n:]
            starts = [i for i in range(len(history) - n) if history[i : i + n] == suffix]
            if starts:
                want = history[starts[-1] + n : starts[-1] + n + 5]
                break
        assert lookup.propose(history, 5) == want


def test_the_auto_gate_pauses_drafting_while_drafts_are_refused_and_tries_again() -> None:
    gate = Gate(threshold=0.25, weight=0.5, pause=2, max_pause=8)
    assert gate.open()
    gate.record(8, 8)
    assert gate.open()
    gate.record(8, 0)  # the kept share falls to 0.5: still on
    assert gate.open()
    gate.record(8, 0)  # 0.25: still on
    gate.record(8, 0)  # 0.125: paused
    assert [gate.open() for _ in range(3)] == [False, False, True]  # a pause of 2 steps, then a try
    gate.record(8, 0)  # refused again: the pause doubles
    assert [gate.open() for _ in range(5)] == [False, False, False, False, True]
    gate.record(8, 8)  # kept: back on, and the pause resets once the rate is good
    gate.record(8, 8)
    assert gate.open()
    gate.record(0, 0)  # a step without a draft says nothing
    assert gate.open()


def test_a_tally_counts_only_steps_that_drafted() -> None:
    tally = Tally()
    tally.record(0, 0)
    tally.record(4, 3)
    tally.record(2, 0)
    assert (tally.drafted, tally.accepted, tally.steps) == (6, 3, 2)


def test_the_auto_gate_drafts_about_the_run_its_kept_share_promises() -> None:
    gate = Gate()
    assert gate.length(8) == 8  # a fresh gate trusts the draft
    gate.rate = 0.5
    assert gate.length(8) == 2  # half kept: one in a row on average, and one more
    gate.rate = 0.75
    assert gate.length(8) == 4
    assert gate.length(3) == 3
    gate.rate = 0.3
    assert gate.length(8) == 2
