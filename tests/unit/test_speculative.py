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


def test_the_auto_gate_drafts_what_pays_by_its_first_guesses() -> None:
    gate = Gate(p=0.75, prior_ratio=0.25)
    # k tokens yield 1 + p + … + p^k for 1 + 0.25·k passes: 1.40, 1.54, 1.56, 1.52 … for k = 1, 2, 3, 4
    assert gate.length(8) == 3
    assert gate.length(2) == 2 and gate.length(0) == 0


def test_the_auto_gate_learns_the_cost_of_a_drafted_position_from_timed_passes() -> None:
    cheap = Gate(p=0.9)
    for k in [0, 1, 2, 4, 8, 3, 0, 6] * 3:
        cheap.record(k, k, 0.010 + 0.0002 * k)  # nearly free positions: a memory-bound GPU
    assert cheap.ratio() == pytest.approx(0.02, abs=0.005)
    assert cheap.length(8) == 8
    dear = Gate(p=0.75)
    for k in [0, 1, 2, 4, 0, 3, 2, 1] * 3:
        dear.record(k, 0 if k == 0 else 1, 0.010 + 0.008 * k)
    assert dear.ratio() == pytest.approx(0.8, abs=0.05)
    assert dear.length(8) == 0  # a drafted position costs most of a pass: drafting does not pay


def test_the_auto_gate_stops_drafting_when_drafts_are_refused_and_probes_again() -> None:
    gate = Gate(p=0.75, prior_ratio=0.25, probe=4)
    for _ in range(30):
        gate.record(3, 0)  # every draft refused at once
    assert gate.p < 0.05
    assert [gate.length(8) for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]  # a one-token probe every 4 steps
    for _ in range(30):
        gate.record(1, 1)  # the probes are kept: a quote began
    assert gate.length(8) >= 3


def test_a_tally_counts_only_steps_that_drafted() -> None:
    tally = Tally()
    tally.record(0, 0)
    tally.record(4, 3)
    tally.record(2, 0)
    assert (tally.drafted, tally.accepted, tally.steps) == (6, 3, 2)
