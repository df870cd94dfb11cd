"""How each model family writes tool calls, chosen from its chat template (:func:`dialect_for`).

One module per shape of call; a family is one :class:`~.base.Dialect` in it and a line in
:data:`DIALECTS`, whose order is the order templates are tried in (the more specific markers first:
Qwen3-Coder's ``<function=`` before Hermes's ``<tool_call>``, which both write). A template that shows
none of them is the generic dialect: the tools described in a system message, the answer one JSON object.
"""

from __future__ import annotations

from llmrun.structured.dialects import json_tagged, mistral, named_json, own_values, xml
from llmrun.structured.dialects.base import Dialect
from llmrun.structured.dialects.syntax import Syntax

GENERIC = Dialect("generic", None, (), "any template without tools (Gemma 3, Phi-3, SmolLM2)", native=False)
HERMES = json_tagged.HERMES
LLAMA3 = json_tagged.LLAMA3
MISTRAL = mistral.NEMO

DIALECTS: tuple[Dialect, ...] = (
    xml.SEED_OSS,
    xml.QWEN3_CODER,
    xml.HUNYUAN,
    xml.GLM,
    xml.MINIMAX_M2,
    xml.MINIMAX_M3,
    xml.DSML_V32,
    xml.DSML_V4,
    xml.MUSE,
    xml.MINICPM,
    xml.KIMI_K3,
    named_json.KIMI_K2,
    named_json.DEEPSEEK_R1,
    named_json.DEEPSEEK_V31,
    named_json.GPT_OSS,
    named_json.SOLAR_OPEN,
    named_json.COHERE,
    named_json.COMMAND_R_PLUS,
    own_values.LFM2,
    own_values.GEMMA4,
    mistral.CALL_ID,
    mistral.ARGS,
    mistral.NEMO,
    json_tagged.MINIMAX_M1,
    json_tagged.APRIEL,
    json_tagged.NEMOTRON_V2,
    json_tagged.GIGACHAT31,
    json_tagged.GIGACHAT3,
    json_tagged.APERTUS,
    named_json.FUNCTIONARY,
    json_tagged.HERMES,
)


def dialect_for(template: str) -> Dialect:
    """How the model behind ``template`` writes tool calls (generic when its template shows no way)."""
    for dialect in DIALECTS:
        if all(marker in template for marker in dialect.markers):
            return dialect
    if "<|start_header_id|>" in template and ("<|python_tag|>" in template or "tools" in template):
        return LLAMA3
    return GENERIC


__all__ = ["DIALECTS", "GENERIC", "HERMES", "LLAMA3", "MISTRAL", "Dialect", "Syntax", "dialect_for"]
