"""Prefix reuse in the continuous-batching decoder (the server's prompt cache), on the real Gemma
model: a slot's next request evaluates only what its KV cells do not hold, and answers as a fresh
evaluation does up to rounding — the same tokens wherever the fresh answer's choice is clear."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmrun.backends.base import LoadParams
from llmrun.backends.gguf import GgufBackend, GgufModel
from llmrun.decoding.events import BatchRequest, Done, Token
from llmrun.decoding.sampling import SamplingParams
from tests.support.helpers import agree_up_to_rounding

pytestmark = pytest.mark.slow

STORY = (
    "The history of the lighthouse keepers of the northern coast is a story of patience. "
    "Every night for two hundred years, someone climbed the stairs and lit the lamp, "
    "whatever the weather and whatever the news from the town below."
)
GREEDY = SamplingParams(temperature=0, max_tokens=16)
TOP = 5


@pytest.fixture(scope="module")
def model(gemma_cache: Path) -> Iterator[GgufModel]:
    loaded = GgufBackend().load(gemma_cache, LoadParams(2048, 2, 0))
    yield loaded
    loaded.close()


def answer(decoder: Any, ids: list[int], index: int = 0) -> tuple[list[Token], Done]:
    """One request through ``decoder`` alone: its tokens (with the top log-probabilities) and its Done."""
    assert decoder.admit(BatchRequest(index, ids, GREEDY), TOP) is None
    tokens: list[Token] = []
    while True:
        for _, event in decoder.step():
            if isinstance(event, Done):
                return tokens, event
            if event.id >= 0:
                tokens.append(event)


def fresh(model: GgufModel, ids: list[int]) -> list[Token]:
    decoder = model.batch_decoder(1, 1024)
    try:
        return answer(decoder, ids)[0]
    finally:
        decoder.close()


def test_a_slots_next_request_evaluates_only_what_is_new(model: GgufModel) -> None:
    story = model.tokenize(STORY, add_bos=True)
    decoder = model.batch_decoder(1, 1024, reuse_prefix=True)
    try:
        generated, first = answer(decoder, story)
        assert first.stats.cached_tokens == 0
        assert [t.id for t in generated] == [t.id for t in fresh(model, story)]  # nothing reused: identical

        again, done = answer(decoder, story)  # the same prompt: all but its last token is kept
        assert done.stats.cached_tokens == len(story) - 1
        agree_up_to_rounding(again, generated)

        # the next turn of a conversation: the prompt, the answer as it was fed back, and more
        follow = story + [t.id for t in generated][:-1] + model.tokenize(" Then one winter night")
        turn, done = answer(decoder, follow)
        assert done.stats.cached_tokens == len(story) + len(generated) - 1
        assert done.stats.prompt_tokens == len(follow)
        agree_up_to_rounding(turn, fresh(model, follow))

        # a different prompt keeps only the shared beginning (BOS)
        other = model.tokenize("Water boils at", add_bos=True)
        unrelated, done = answer(decoder, other)
        assert done.stats.cached_tokens == 1
        agree_up_to_rounding(unrelated, fresh(model, other))
    finally:
        decoder.close()


def test_a_request_goes_to_the_slot_that_holds_most_of_it(model: GgufModel) -> None:
    story = model.tokenize(STORY, add_bos=True)
    other = model.tokenize("Once upon a time, in a village by the sea, there lived an old fisherman", add_bos=True)
    decoder = model.batch_decoder(2, 1024, reuse_prefix=True)
    try:
        for index, ids in enumerate((story, other)):  # both running together, one slot each
            assert decoder.admit(BatchRequest(index, ids, GREEDY)) is None
        finished = 0
        while finished < 2:
            finished += sum(isinstance(event, Done) for _, event in decoder.step())
        for ids in (other, story):
            longer = ids + model.tokenize(" and so")
            tokens, done = answer(decoder, longer)
            assert done.stats.cached_tokens >= len(ids)  # its own slot, not the other one
            agree_up_to_rounding(tokens, fresh(model, longer))
    finally:
        decoder.close()


def test_without_reuse_every_prompt_is_evaluated_whole(model: GgufModel) -> None:
    story = model.tokenize(STORY, add_bos=True)
    decoder = model.batch_decoder(1, 1024)  # the default: the batch command's
    try:
        first, _ = answer(decoder, story)
        again, done = answer(decoder, story)
        assert done.stats.cached_tokens == 0 and [t.id for t in again] == [t.id for t in first]
    finally:
        decoder.close()


def test_the_same_prompt_in_two_slots_at_once_is_evaluated_once(model: GgufModel) -> None:
    """``n`` choices of one request: the prompt goes into the batch once, the second slot takes its cells
    and samples its first token from the same logits row, with its own sampler."""
    story = model.tokenize(STORY, add_bos=True)
    decoder = model.batch_decoder(2, 1024, reuse_prefix=True)
    try:
        for index in (0, 1):
            assert decoder.admit(BatchRequest(index, story, GREEDY), TOP) is None
        first_step = decoder.step()
        assert decoder._batch.batch.n_tokens == len(story)  # one copy of the prompt
        assert sorted(index for index, _ in first_step) == [0, 1]  # both sampled from it
        tokens: dict[int, list[Token]] = {0: [], 1: []}
        done: dict[int, Done] = {}
        events = first_step
        while True:
            for index, event in events:
                if isinstance(event, Done):
                    done[index] = event
                elif event.id >= 0:
                    tokens[index].append(event)
            if len(done) == 2:
                break
            events = decoder.step()
        assert done[0].stats.cached_tokens == 0 and done[1].stats.cached_tokens == len(story)
        assert [t.id for t in tokens[1]] == [t.id for t in tokens[0]]  # the same cells, the same rows
        agree_up_to_rounding(tokens[0], fresh(model, story))
    finally:
        decoder.close()
