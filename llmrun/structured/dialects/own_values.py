"""Families whose arguments are in a syntax of their own: Python keywords (LFM2), Gemma 4's objects."""

from llmrun.structured.dialects.base import Dialect
from llmrun.structured.dialects.syntax import Syntax

LFM2 = Dialect(
    "lfm2",
    Syntax("{name}({python})", opens=("<|tool_call_start|>[",), between=", ", close="]<|tool_call_end|>"),
    ("<|tool_call_start|>",),
    "LFM2, LFM2.5",
)
GEMMA4 = Dialect(
    "gemma4",
    Syntax("<|tool_call>call:{name}{gemma}<tool_call|>"),
    ("<|tool_call>",),
    "Gemma 4",
)
