"""Mistral's families: ``[TOOL_CALLS]`` then a JSON list (Nemo, 7B v0.3), or each call's name then
``[ARGS]`` (Ministral 3, Magistral, Devstral; Small 3.2 with a ``[CALL_ID]``). Ids are nine letters and digits."""

from llmrun.structured.dialects.base import Dialect
from llmrun.structured.dialects.syntax import Syntax

NEMO = Dialect(
    "mistral",
    Syntax(
        '{{"name": "{name}", "arguments": {args}, "id": "{id}"}}',
        opens=("[TOOL_CALLS][", "["),  # [TOOL_CALLS] is a control token: it may show as nothing
        between=", ",
        close="]",
        also=('{{"name": "{name}", "arguments": {args}}}',),
    ),
    ("[TOOL_CALLS]",),
    "Mistral 7B v0.3, Nemo, Small 3.1",
    id_style="nine",
)
ARGS = Dialect(
    "mistral-args",
    Syntax("[TOOL_CALLS]{name}[ARGS]{args}"),
    ("[TOOL_CALLS]", "[ARGS]"),
    "Ministral 3, Magistral, Devstral",
    id_style="nine",
)
CALL_ID = Dialect(
    "mistral-call-id",
    Syntax("[TOOL_CALLS]{name}[CALL_ID]{id}[ARGS]{args}"),
    ("[TOOL_CALLS]", "[CALL_ID]"),
    "Mistral Small 3.2",
    id_style="nine",
)
