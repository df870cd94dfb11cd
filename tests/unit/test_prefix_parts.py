"""The pure rules of prefix reuse: what a sequence's kept cells can give the next prompt."""

from __future__ import annotations

from llmrun.backends.gguf_batch import window_intact
from llmrun.decoding.tokens import common_prefix, reusable


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5], [1]) == 0


def test_the_last_prompt_token_is_always_evaluated() -> None:
    assert reusable([1, 2, 3, 9, 9], [1, 2, 3, 4]) == 3
    assert reusable([1, 2, 3, 4], [1, 2, 3, 4]) == 3  # the same prompt: its logits come from its last token
    assert reusable([1, 2, 3, 4, 5], [1, 2]) == 1
    assert reusable([7], [1, 2]) == 0 and reusable([1], []) == 0


def test_a_sliding_window_cache_must_still_hold_the_window() -> None:
    assert window_intact(0, 100, 0)  # a full cache holds everything
    assert not window_intact(40, 100, 0)  # cells missing from a cache without a window
    assert window_intact(51, 100, 50) and window_intact(10, 100, 50)  # the token at 100 attends from 51 on
    assert not window_intact(52, 100, 50)  # position 51 is gone
    assert window_intact(0, 30, 50) and not window_intact(1, 30, 50)  # shorter than the window: all of it
    assert window_intact(-1, 0, 50)  # nothing kept: nothing to check
    assert not window_intact(-1, 10, 0)  # an empty sequence cannot give 10 positions
