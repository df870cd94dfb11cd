"""The shared generation loop, fed hand-made token pieces (no model needed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmrun.decoding.assembler import assemble, token_budget
from llmrun.decoding.events import Done, Token
from llmrun.decoding.sampling import SamplingParams
from llmrun.errors import UsageError

EOS = 0


def _pieces(parts: list[bytes]) -> tuple[Iterator[int], dict[int, bytes]]:
    table = {i + 1: p for i, p in enumerate(parts)}
    return iter(table), table


def _run(parts: list[bytes], params: SamplingParams, n_ctx: int = 100, end: bool = False) -> list[Token | Done]:
    ids, table = _pieces(parts)
    source = iter([*ids, EOS] if end else ids)
    return list(
        assemble(
            source, lambda i: table.get(i, b""), lambda i: i == EOS, prompt_tokens=3, n_ctx=n_ctx, params=params, seed=7
        )
    )


def test_split_emoji_is_printed_once_whole() -> None:
    emoji = "🦜".encode()
    events = _run([b"a", emoji[:2], emoji[2:], b"b"], SamplingParams())
    texts = [e.text for e in events if isinstance(e, Token)]
    assert texts == ["a", "", "🦜", "b"]
    done = events[-1]
    assert isinstance(done, Done) and done.text == "a🦜b"


def test_eos_ends_generation() -> None:
    done = _run([b"x"], SamplingParams(), end=True)[-1]
    assert isinstance(done, Done)
    assert done.stats.finish_reason == "eos"
    assert done.stats.seed == 7


def test_max_tokens_ends_with_length() -> None:
    done = _run([b"a", b"b", b"c", b"d"], SamplingParams(max_tokens=2))[-1]
    assert isinstance(done, Done)
    assert (done.text, done.stats.generated_tokens, done.stats.finish_reason) == ("ab", 2, "length")


def test_context_limit_ends_with_context() -> None:
    done = _run([b"a", b"b", b"c", b"d"], SamplingParams(max_tokens=-1), n_ctx=5)[-1]
    assert isinstance(done, Done)
    assert (done.text, done.stats.finish_reason) == ("ab", "context")


def test_stop_string_across_tokens_is_cut() -> None:
    done = _run([b"The ", b"EN", b"D", b"!"], SamplingParams(stop=("END",)))[-1]
    assert isinstance(done, Done)
    assert (done.text, done.stats.finish_reason, done.stats.stop_string) == ("The ", "stop", "END")


def test_prompt_longer_than_context_is_refused() -> None:
    with pytest.raises(UsageError, match="context holds 3"):
        token_budget(3, 3, SamplingParams())
