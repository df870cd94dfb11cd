"""Families that write each argument as its own tagged text: a string as it is, anything else as JSON."""

from llmrun.structured.dialects.base import Dialect
from llmrun.structured.dialects.syntax import Syntax

QWEN3_CODER = Dialect(
    "qwen3-coder",
    Syntax(
        "<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>",
        "<parameter={key}>\n{value}\n</parameter>\n",
        between="\n",
    ),
    ("<function=", "<parameter="),
    "Qwen3-Coder, Qwen3.5, Nemotron 3, StepFun 3.5",
)
SEED_OSS = Dialect(
    "seed-oss",
    Syntax(
        "<seed:tool_call>\n<function={name}>\n{params}</function>\n</seed:tool_call>",
        "<parameter={key}>{value}</parameter>\n",
        between="\n",
    ),
    ("<seed:tool_call>",),
    "Seed-OSS",
)
GLM = Dialect(
    "glm",
    Syntax(
        "<tool_call>{name}\n{params}</tool_call>",
        "<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n",
        between="\n",
        loose=True,
    ),
    ("<arg_key>",),
    "GLM 4.5/4.6/4.7, Laguna, Ling, Spark",
)
HUNYUAN = Dialect(
    "hunyuan",
    Syntax(
        "<tool_call:opensource>{name}<tool_sep:opensource>\n{params}</tool_call:opensource>\n",
        "<arg_key:opensource>{key}</arg_key:opensource>\n<arg_value:opensource>{value}</arg_value:opensource>\n",
        opens=("<tool_calls:opensource>\n",),
        close="</tool_calls:opensource>",
    ),
    ("<tool_sep{}>",),
    "Hunyuan (Hy3)",
)
MINIMAX_M2 = Dialect(
    "minimax-m2",
    Syntax(
        '<invoke name="{name}">\n{params}</invoke>\n',
        '<parameter name="{key}">{value}</parameter>\n',
        opens=("<minimax:tool_call>\n",),
        close="</minimax:tool_call>",
    ),
    ("<minimax:tool_call>",),
    "MiniMax M2",
)
MINIMAX_M3 = Dialect(
    "minimax-m3",
    Syntax(
        ']<]minimax[>[<invoke name="{name}">{params}]<]minimax[>[</invoke>\n',
        "]<]minimax[>[<{key}>{value}]<]minimax[>[</{key}>",
        opens=("]<]minimax[>[<tool_call>\n",),
        close="]<]minimax[>[</tool_call>",
    ),
    ("]<]minimax[>[",),
    "MiniMax M3",
)
DSML_V32 = Dialect(
    "deepseek-v3.2",
    Syntax(
        '<｜DSML｜invoke name="{name}">\n{params}</｜DSML｜invoke>\n',
        '<｜DSML｜parameter name="{key}" string="{typed}">{value}</｜DSML｜parameter>\n',
        opens=("<｜DSML｜function_calls>\n",),
        close="</｜DSML｜function_calls>",
    ),
    ("｜DSML｜", "function_calls"),
    "DeepSeek V3.2",
)
DSML_V4 = Dialect(
    "deepseek-v4",
    Syntax(
        '<｜DSML｜invoke name="{name}">\n{params}</｜DSML｜invoke>\n',
        '<｜DSML｜parameter name="{key}" string="{typed}">{value}</｜DSML｜parameter>\n',
        opens=("<｜DSML｜tool_calls>\n",),
        close="</｜DSML｜tool_calls>",
    ),
    ("｜DSML｜",),
    "DeepSeek V4",
)
MUSE = Dialect(
    "muse",
    Syntax(
        '<atem:invoke name="{name}">\n{params}</atem:invoke>\n',
        '<atem:parameter name="{key}">{value}</atem:parameter>\n',
        opens=("<atem:function_calls>\n",),
        close="</atem:function_calls>",
        lead=r"\s*to=[\w.\-]+<\|message\|>",
    ),
    ("atem:function_calls",),
    "Muse Glimmer",
)
MINICPM = Dialect(
    "minicpm",
    Syntax('<function name="{name}">{params}</function>', '<param name="{key}">{value}</param>', between="\n"),
    ('<function name="',),
    "MiniCPM 5",
)
KIMI_K3 = Dialect(
    "kimi-k3",
    Syntax(
        '<|open|>call tool="{name}" index="{index}"<|sep|>{params}<|close|>call<|sep|>',
        '<|open|>argument key="{key}" type="{typed}"<|sep|>{value}<|close|>argument<|sep|>',
        opens=("<|open|>tools<|sep|>",),
        close="<|close|>tools<|sep|>",
        typed="json_type",
        first_index=1,
    ),
    ("<|open|>", "<|sep|>"),
    "Kimi K3",
)
