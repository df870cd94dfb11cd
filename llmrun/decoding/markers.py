"""Which of a vocabulary's user-defined tokens are markup, kept out of an answer's text (pure).

A GGUF file marks a vocabulary's control tokens (``<bos>``, ``<end_of_turn>``) and its
user-defined ones; llama.cpp prints the user-defined ones as text. Many of those are markers the
model's tokenizer calls special — Gemma 3's ``<start_of_image>``, FIM and tool-response markers —
which transformers' ``skip_special_tokens`` and MLX drop from an answer; others are words the
model writes on purpose (runs of newlines, ``<think>``, ``<tool_call>``). A user-defined token is
hidden when its whole text is a marker — ``<name>``, ``<|name|>``, ``</name>`` or ``[NAME]``,
without spaces — unless llmrun reads it out of the answer: the reasoning markers it splits on and
the tool-call markers it parses.
"""

from __future__ import annotations

import re

from llmrun.decoding.reasoning import KNOWN_MARKERS

_MARKUP = re.compile(r"<\|?/?[A-Za-z_][\w:.\-|]*\|?>|\[/?[A-Za-z_@][\w@]*\]")

# what the answer's own parsers need to see (structured.tools reads these from the text)
TOOL_MARKERS = frozenset(
    {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "[TOOL_CALLS]", "<|python_tag|>"}
)
KEPT = TOOL_MARKERS | {m.open for m in KNOWN_MARKERS} | {m.close for m in KNOWN_MARKERS}


def is_hidden_marker(text: str) -> bool:
    """Whether a user-defined token that spells ``text`` is kept out of an answer's text."""
    return text not in KEPT and _MARKUP.fullmatch(text) is not None
