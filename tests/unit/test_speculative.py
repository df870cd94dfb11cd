"""Speculative decoding's pure half: the draft setting, prompt lookup, and the auto gate."""

from __future__ import annotations

import pytest

from llmrun.decoding.speculative import DEFAULT_DRAFT_TOKENS, Draft, Gate, PromptLookup, Tally
from llmrun.errors import InvalidParameter


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


def test_prompt_lookup_copies_the_first_occurrence_in_the_prompt_and_the_latest_in_the_answer() -> None:
    lookup = PromptLookup()
    prompt = [1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7, 8, 2, 3]
    history = [*prompt, 4]  # the first call: the prompt and the first sampled token
    # the suffix (2, 3, 4) occurred in the prompt at 1..3 (then 5, 9) and at 6..8 (then 6, 7, 8): the first wins
    assert lookup.propose(history, 2) == [5, 9]
    assert lookup.propose(history, 20) == history[4:]  # the copy may run up to the end
    assert lookup.propose(history, 0) == []
    history += [5, 9, 2, 3, 4, 7, 7, 2, 3, 4]
    # now (2, 3, 4) also occurred in the answer (at 17..19, then 7, 7): the answer's latest wins
    assert lookup.propose(history, 2) == [7, 7]
    assert PromptLookup().propose([6, 7, 6, 7], 5) == [6, 7]  # an occurrence overlapping the suffix counts


def test_prompt_lookup_told_where_the_prompt_ends_counts_an_answer_it_did_not_see_grow() -> None:
    history = [1, 2, 9, 9, 1, 2, 7, 1, 2]  # a prompt of four tokens, then an answer first looked up late
    assert PromptLookup(prompt_tokens=4).propose(history, 2) == [7, 1]  # (1, 2) in the answer: its latest
    assert PromptLookup().propose(history, 2) == [9, 9]  # unsaid, all but the last token is the prompt: its first


def test_prompt_lookup_falls_back_to_shorter_suffixes_and_finds_nothing_new() -> None:
    lookup = PromptLookup(sizes=(3, 2))
    assert lookup.propose([5, 6, 7, 1, 6, 7], 2) == [1, 6]  # only the 2-gram (6, 7) occurred before
    assert PromptLookup().propose([1, 2, 3, 4, 5], 4) == []  # nothing repeats
    assert PromptLookup().propose([7], 4) == []


def test_prompt_lookup_follows_a_growing_history_and_restarts_on_another() -> None:
    lookup = PromptLookup()
    history = [10, 11, 12, 13, 10, 11]
    assert lookup.propose(history, 2) == [12, 13]
    history += [12, 99, 10, 11, 12]  # grows: indexed incrementally; (10, 11, 12) first occurred at the start
    assert lookup.propose(history, 2) == [13, 10]
    history += [99, 5, 12, 99]  # (12, 99) occurred twice since, in the answer: the latest goes on 5, 12, 99
    assert lookup.propose(history, 3) == [5, 12, 99]
    assert lookup.propose([1, 2, 1, 2], 1) == [1]  # not an extension: a fresh index, no stale n-grams
    assert lookup.propose([4, 5, 4, 5], 2) == [4, 5]


@pytest.mark.parametrize("prompt_length", [2, 40, 200])
def test_prompt_lookup_agrees_with_a_brute_force_search(prompt_length: int) -> None:
    import random

    rng = random.Random(prompt_length)
    lookup = PromptLookup(sizes=(3, 2))
    history = [rng.randrange(6) for _ in range(prompt_length)]
    answer = prompt_length  # the first call: the prompt and the first token the model sampled
    for _ in range(400):
        history.append(rng.randrange(6))
        want: list[int] = []
        for n in (3, 2):
            if len(history) <= n:
                continue
            suffix = history[-n:]
            starts = [i for i in range(len(history) - n) if history[i : i + n] == suffix]
            if starts:
                in_answer = [i for i in starts if i >= answer]
                start = in_answer[-1] if in_answer else starts[0]
                want = history[start + n : start + n + 5]
                break
        assert lookup.propose(history, 5) == want


def test_the_auto_gate_drafts_what_pays_by_its_first_guesses() -> None:
    gate = Gate(prior_ratio=0.25)
    assert gate.p == 0.75
    # k tokens yield 1 + p + … + p^k for 1 + 0.25·k passes: 1.40, 1.54, 1.56, 1.52 … for k = 1, 2, 3, 4
    assert gate.length(8) == 3
    assert gate.length(2) == 2 and gate.length(0) == 0


def test_the_auto_gate_learns_the_cost_of_a_drafted_position_from_timed_passes() -> None:
    cheap = Gate(kept=9.0, refused=1.0)
    for k in [0, 1, 2, 4, 8, 3, 0, 6] * 3:
        cheap.record(k, k, 0.010 + 0.0002 * k)  # nearly free positions: a memory-bound GPU
    assert cheap.ratio() == pytest.approx(0.02, abs=0.005)
    assert cheap.length(8) == 8
    dear = Gate()
    for k in [0, 1, 2, 4, 0, 3, 2, 1] * 3:
        dear.record(k, 0 if k == 0 else 1, 0.010 + 0.008 * k)
    assert dear.ratio() == pytest.approx(0.8, abs=0.05)
    assert dear.length(8) == 0  # a drafted position costs most of a pass: drafting does not pay


def test_the_auto_gate_stops_drafting_when_drafts_are_refused_and_probes_again() -> None:
    gate = Gate(prior_ratio=0.25, probe=4)
    for _ in range(30):
        gate.record(3, 0)  # every draft refused at once
    assert gate.p < 0.05
    assert [gate.length(8) for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]  # a one-token probe every 4 steps
    for _ in range(30):
        gate.record(1, 1)  # the probes are kept: a quote began
    assert gate.length(8) >= 3


def test_the_auto_gate_counts_a_draft_kept_whole_once_per_token() -> None:
    gate = Gate(prior_ratio=0.25)
    for _ in range(20):
        gate.record(8, 8)  # a quote: the whole draft kept
        gate.record(8, 0)  # then a refusal at once
    # 8 tokens kept for each refusal: p near 8/9 (averaging each step's fraction would say 1/2, and draft 1)
    assert gate.p == pytest.approx(8 / 9, abs=0.02)
    assert gate.length(8) >= 4


def test_a_tally_counts_only_steps_that_drafted() -> None:
    tally = Tally()
    tally.record(0, 0)
    tally.record(4, 3)
    tally.record(2, 0)
    assert (tally.drafted, tally.accepted, tally.steps) == (6, 3, 2)


def test_the_draft_help_says_where_a_greedy_answer_can_part() -> None:
    from typing import get_args

    from llmrun.cli.options import DraftOpt

    words = get_args(DraftOpt)[1].help
    assert "same as without" not in words  # measured: it parts at near-ties (issue 41)
    assert "near-ties" in words and "0.1" in words
