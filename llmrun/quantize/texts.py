"""The fixed evaluation text shipped with the package: the same tokens for every measurement.

``eval.txt`` (written for llmrun, about 2,300 Gemma tokens) mixes narrative, science,
instructions, dialogue, Python code and a Korean paragraph, so a quantization's cost
shows across the kinds of text people give a model. :data:`ENGLISH` is its first
paragraph (about 300 tokens), for quick checks.
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def eval_text() -> str:
    return resources.files("llmrun.quantize").joinpath("eval.txt").read_text(encoding="utf-8")


ENGLISH = eval_text().split("\n\n", 1)[0]
