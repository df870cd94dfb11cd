"""Which user-defined tokens are markup kept out of an answer (llmrun.decoding.markers)."""

from __future__ import annotations

import pytest

from llmrun.decoding.markers import is_hidden_marker


@pytest.mark.parametrize(
    "text",
    [
        "<start_of_image>",
        "<end_of_image>",
        "<|fim_prefix|>",
        "<|im_start|>",
        "</s>",
        "<unused12>",
        "[multimodal]",
        "[INST]",
        "[/INST]",
        "<|endoftext|>",
    ],
)
def test_markup_tokens_are_hidden(text: str) -> None:
    assert is_hidden_marker(text)


@pytest.mark.parametrize(
    "text",
    [
        "\n\n",  # Gemma's user-defined runs of newlines
        "<think>",
        "</think>",
        "[THINK]",
        "<|START_THINKING|>",  # reasoning: split out of the answer
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
        "[TOOL_CALLS]",  # tool calls: parsed from it
        "< b >",
        "<a href>",
        "a<b>",
        "<>",
        "[ ]",
        "<3",  # text, not a marker
    ],
)
def test_words_and_the_markers_llmrun_reads_stay(text: str) -> None:
    assert not is_hidden_marker(text)
