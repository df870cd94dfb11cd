"""Core code names parameters by field (`n_ctx`); the CLI and the server each word them their way."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from llmrun.api.errors import REQUEST_FIELDS, explain, worded
from llmrun.api.flags import FLAGS
from llmrun.decoding.sampling import SamplingParams
from llmrun.errors import ContextFull, InvalidParameter, LlmrunError, mentions, word

PACKAGE = Path(__file__).resolve().parents[2] / "llmrun"
ADAPTERS = ("cli", "server")  # the modules that word parameters; every other module is core
A_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _core_strings() -> list[tuple[str, str]]:
    """(module, text) of every string literal in core modules that is not a docstring."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ADAPTERS:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):  # an f-string as one text, "{}" for what it puts in
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
                found.append((str(relative), str(text)))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                skipped = id(node) in docstrings or id(node) in in_fstrings
                found += [] if skipped else [(str(relative), node.value)]
    return found


def test_core_text_names_parameters_not_flags() -> None:
    """No core message words a flag itself — only whole commands a user would type (llmrun …, pip …,
    ggml-rpc-server …)
    and argument lists for programs llmrun starts may carry flags."""
    wording = [
        (module, text)
        for module, text in _core_strings()
        if A_FLAG.search(text)
        and not A_FLAG.fullmatch(text)  # an argv item: ["--threads", "4"]
        and not re.search(r"\b(llmrun|pip install|qpdf|ggml-rpc-server) ", text)
    ]
    assert wording == []


def test_every_parameter_core_names_has_words_in_both_adapters() -> None:
    named = set().union(*(mentions(text) for _, text in _core_strings()))
    assert {"n_ctx", "force", "raw", "debug"} <= named  # the scan finds them
    assert named - FLAGS.keys() == set()
    for name in named:
        assert "`" not in worded(f"`{name}`")


def test_the_same_error_in_each_adapters_words() -> None:
    error = ContextFull("the prompt is 900 tokens but the context holds 512", "shorten the prompt or raise `n_ctx`")
    assert error.worded(FLAGS) == (error.message, "shorten the prompt or raise --ctx")
    assert explain(error) == f"{error.message}; shorten the prompt or raise the server's --ctx"
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(top_p=1.5)
    assert info.value.worded(FLAGS)[0].startswith("--top-p must be in (0, 1]")
    assert worded(info.value.message).startswith("top_p must be in (0, 1]")  # the JSON field a client sent
    assert {"temperature", "max_tokens", "stop", "seed"} <= REQUEST_FIELDS


def test_word_leaves_what_it_does_not_know() -> None:
    assert word("use `raw` or `unknown_thing`", {"raw": "--raw"}) == "use --raw or `unknown_thing`"
    assert word("no mentions here: `Code` and ``x``", FLAGS) == "no mentions here: `Code` and ``x``"
    assert str(LlmrunError("raise `n_ctx`")) == "raise `n_ctx`"
