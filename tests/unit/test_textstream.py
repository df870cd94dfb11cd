"""UTF-8 split across tokens and stop strings split across tokens."""

from __future__ import annotations

import pytest

from llmrun.decoding.textstream import StopMatcher, Utf8Stream


@pytest.mark.parametrize("text", ["안녕하세요", "🦜🎉 ok", "naïve café", "日本語"])
def test_any_byte_split_never_prints_a_replacement_character(text: str) -> None:
    data = text.encode("utf-8")
    for size in (1, 2, 3):
        stream = Utf8Stream()
        pieces = [stream.feed(data[i : i + size]) for i in range(0, len(data), size)]
        assert "\ufffd" not in "".join(pieces)
        assert "".join(pieces) == text
        assert stream.pending == b""


def test_an_unfinished_character_at_the_end_is_dropped_not_replaced() -> None:
    stream = Utf8Stream()
    assert stream.feed(b"a" + "🦜".encode()[:2]) == "a"
    assert stream.pending == "🦜".encode()[:2]
    assert stream.finish() == ""


def test_stop_string_split_across_pieces_is_held_and_cut() -> None:
    matcher = StopMatcher(["END"])
    out = [matcher.feed(p) for p in ["Hello E", "N", "D tail"]]
    assert "".join(out) == "Hello "
    assert matcher.stopped_by == "END"
    assert matcher.feed("more") == ""


def test_held_text_that_is_not_a_stop_is_released() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("wE") == "w"
    assert matcher.feed("x") == "Ex"
    assert matcher.feed("E") == ""
    assert matcher.flush() == "E"
    assert matcher.stopped_by is None


def test_earliest_of_several_stops_wins() -> None:
    matcher = StopMatcher(["bb", "a"])
    assert matcher.feed("xxbba") == "xx"
    assert matcher.stopped_by == "bb"
