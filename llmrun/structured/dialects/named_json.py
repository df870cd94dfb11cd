"""Families that write a call's name in their own markers, then its arguments as a JSON object."""

from llmrun.structured.dialects.base import Dialect
from llmrun.structured.dialects.syntax import Syntax

KIMI_K2 = Dialect(
    "kimi-k2",
    Syntax(
        "<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{args}<|tool_call_end|>",
        opens=("<|tool_calls_section_begin|>",),
        close="<|tool_calls_section_end|>",
    ),
    ("<|tool_call_argument_begin|>",),
    "Kimi K2",
)
DEEPSEEK_R1 = Dialect(
    "deepseek-r1",
    Syntax(
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>",
        opens=("<｜tool▁calls▁begin｜>",),
        between="\n",
        close="<｜tool▁calls▁end｜>",
    ),
    ("<｜tool▁sep｜>", "```json"),
    "DeepSeek R1 and its distills",
)
DEEPSEEK_V31 = Dialect(
    "deepseek-v3.1",
    Syntax(
        "<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>",
        opens=("<｜tool▁calls▁begin｜>",),
        close="<｜tool▁calls▁end｜>",
    ),
    ("<｜tool▁sep｜>",),
    "DeepSeek V3/V3.1",
)
GPT_OSS = Dialect(
    "gpt-oss",
    Syntax(
        " to=functions.{name}<|channel|>commentary json<|message|>{args}<|call|>",
        also=("<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}<|call|>",),
        most=1,
    ),
    ("<|channel|>", "<|message|>"),
    "gpt-oss (harmony)",
)
FUNCTIONARY = Dialect(
    "functionary-v3.1",
    Syntax("<function={name}>{args}</function>"),
    ("<function=", "<|start_header_id|>"),
    "Functionary v3.1",
)
SOLAR_OPEN = Dialect(
    "solar-open",
    Syntax(
        "<|tool_call:begin|>{id}<|tool_call:name|>{name}<|tool_call:args|>{args}<|tool_call:end|>",
        opens=("<|tool_calls|>",),
        close="<|calls|>",
        id="[A-Za-z0-9_]{1,40}",
    ),
    ("<|tool_call:begin|>",),
    "Solar Open",
)
COHERE = Dialect(
    "command-r7b",
    Syntax(
        '{{"tool_call_id": "{index}", "tool_name": "{name}", "parameters": {args}}}',
        opens=("<|START_ACTION|>[\n    ",),
        between=",\n    ",
        close="\n]<|END_ACTION|>",
    ),
    ("<|START_ACTION|>",),
    "Command R7B, Command A",
)
COMMAND_R_PLUS = Dialect(
    "command-r-plus",
    Syntax(
        '{{\n        "tool_name": "{name}",\n        "parameters": {args}\n    }}',
        opens=("Action:\n```json\n[\n    ",),
        between=",\n    ",
        close="\n]```",
    ),
    ("Action:", "<|START_OF_TURN_TOKEN|>"),
    "Command R+",
)
