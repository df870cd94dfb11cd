"""Families that write each call as a JSON object ``{"name": …, "arguments": {…}}`` between their own tags."""

from llmrun.structured.dialects.base import Dialect
from llmrun.structured.dialects.syntax import Syntax

CALL = '{{"name": "{name}", "arguments": {args}}}'

HERMES = Dialect(
    "hermes",
    Syntax(f"<tool_call>\n{CALL}\n</tool_call>", between="\n"),
    ("<tool_call>",),
    "Qwen 2.5/3, QwQ, Hermes 2/3, Granite 4, MiMo, Bielik, Reka, SmolLM3",
)
MINIMAX_M1 = Dialect(
    "minimax-m1",
    Syntax(CALL, opens=("<tool_calls>\n",), between="\n", close="\n</tool_calls>"),
    ("<tool_calls>", "<beginning_of_sentence>"),
    "MiniMax M1",
)
APRIEL = Dialect(
    "apriel",
    Syntax(
        '{{"name": "{name}", "arguments": {args}, "id": "{id}"}}',
        opens=("<tool_calls>[",),
        between=", ",
        close="]</tool_calls>",
        id="[A-Za-z0-9_\\-]{1,40}",
        also=(CALL,),
    ),
    ("<tool_calls>",),
    "Apriel 1.5/1.6",
)
NEMOTRON_V2 = Dialect(
    "nemotron-v2",
    Syntax(CALL, opens=("<TOOLCALL>[",), between=", ", close="]</TOOLCALL>"),
    ("<TOOLCALL>",),
    "Nemotron Nano v2",
)
GIGACHAT3 = Dialect(
    "gigachat3",
    Syntax(CALL, opens=("<|message_sep|>\n\nfunction call<|role_sep|>\n", "function call<|role_sep|>\n"), most=1),
    ("'function call'", "<|role_sep|>"),
    "GigaChat 3",
)
GIGACHAT31 = Dialect(
    "gigachat3.1",
    Syntax(CALL, opens=("<|function_call|>",), most=1),
    ("<|function_call|>",),
    "GigaChat 3.1",
)
APERTUS = Dialect(
    "apertus",
    Syntax('{{"{name}": {args}}}', opens=("<|tools_prefix|>[",), between=", ", close="]<|tools_suffix|>"),
    ("<|tools_prefix|>",),
    "Apertus",
)
LLAMA3 = Dialect(
    "llama3",
    Syntax('{{"name": "{name}", "parameters": {args}}}', opens=("", "<|python_tag|>"), most=1, json_call="parameters"),
    ("<|start_header_id|>",),
    "Llama 3.1/3.2/3.3",
)
