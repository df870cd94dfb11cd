"""Chat pieces that need no model: built-in templates, saved files, /set parsing, Markdown blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrun.api.flags import FLAGS
from llmrun.cli.chat import Repl
from llmrun.cli.streams import block_end
from llmrun.decoding.sampling import SamplingParams
from llmrun.engine.chat import ChatSession, Turn, read_saved
from llmrun.errors import UsageError, word
from llmrun.prompt.template import BUILTIN_TEMPLATES, Context, Message, builtin_for, render_text
from tests.support import imagefiles

CONVERSATION = [
    Message("system", "Be brief."),
    Message("user", "Hi"),
    Message("assistant", "Hello!"),
    Message("user", "Bye"),
]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "chatml",
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "llama3",
            "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "gemma",
            "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
        ),
        ("mistral", "<s>[INST] Be brief.\n\nHi [/INST]Hello!</s>[INST] Bye [/INST]"),
        (
            "phi3",
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n"
            "<|assistant|>\n",
        ),
        ("raw", "Be brief.\n\nHi\n\nHello!\n\nBye\n\n"),
    ],
)
def test_builtin_templates_render_exactly(name: str, expected: str) -> None:
    assert render_text(BUILTIN_TEMPLATES[name], CONVERSATION, Context("<s>", "</s>")) == expected


def test_builtin_by_architecture() -> None:
    assert builtin_for("gemma3") == "gemma"
    assert builtin_for("qwen2") == "chatml"
    assert builtin_for("llama") == "llama3"
    assert builtin_for("something-new") == "chatml"


def _session() -> ChatSession:
    return ChatSession(None, "m", "", "raw", SamplingParams())  # type: ignore[arg-type]


def test_set_param_validates_like_the_flags() -> None:
    session = _session()
    assert session.set_param("temperature", "0.2") == ("temperature", 0.2)
    assert session.set_param("top-k", "5") == ("top_k", 5)
    assert session.set_param("t", "0") == ("temperature", 0.0)
    assert session.set_param("stop", "END|###") == ("stop", ("END", "###"))
    assert session.set_param("seed", "random") == ("seed", None)
    with pytest.raises(UsageError, match=r"/set top_p must be in \(0, 1\]"):
        session.set_param("top_p", "3")
    with pytest.raises(UsageError, match="needs an integer"):
        session.set_param("top_k", "many")
    with pytest.raises(UsageError) as info:
        session.set_param("temprature", "1")
    assert "did you mean temperature" in info.value.hint
    for name in ("ctx", "n_ctx", "threads", "kv-bits"):  # load settings: refused with a way to change them
        with pytest.raises(UsageError, match="is set when the model loads") as info:
            session.set_param(name, "2048")
    ctx = _session()
    with pytest.raises(UsageError) as info:
        ctx.set_param("ctx", "2048")
    assert word(info.value.hint, FLAGS) == "/save NAME, then restart with --ctx 2048 and /load NAME"


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    session = _session()
    session.system = "Be nice."
    png = imagefiles.png_bytes(4, 4)
    session.turns = [Turn("user", "Hi <start_of_turn>", images=(png,)), Turn("assistant", "Hel", interrupted=True)]
    session.set_param("temperature", "0.3")
    path = session.save(tmp_path, "trip-plan")
    assert path == tmp_path / "trip-plan.json" and not list(tmp_path.glob(".partial-*"))
    other = _session()
    other.load(tmp_path, "trip-plan")
    assert other.turns == session.turns and other.system == "Be nice." and other.params == session.params
    md = other.export_markdown(tmp_path / "t.md").read_text()
    assert "**You:**" in md and "*(interrupted)*" in md and "Hi <start_of_turn>" in md


@pytest.mark.parametrize("name", ["../etc/passwd", "/abs", "a/b", "", ".hidden", "x.json", "a" * 65, "nul\x00"])
def test_chat_names_cannot_be_paths(tmp_path: Path, name: str) -> None:
    with pytest.raises(UsageError, match="not a valid chat name"):
        _session().save(tmp_path, name)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not a valid saved chat"),
        (b"\xff\xfe", "not a valid saved chat"),
        (json.dumps({"version": 9}).encode(), "version 1"),
        (
            json.dumps({"version": 1, "system": None, "params": {}, "messages": [{"role": "root"}]}).encode(),
            "message 0",
        ),
        (
            json.dumps({"version": 1, "system": None, "params": {"top_p": 7}, "messages": []}).encode(),
            "bad params",
        ),
        (
            json.dumps(
                {"version": 1, "system": None, "params": {}, "messages": [{"role": "user", "content": "", "images": 3}]}
            ).encode(),
            "message 0: images is not a list",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "system": None,
                    "params": {},
                    "messages": [{"role": "user", "content": "", "images": ["aGk="]}],
                }
            ).encode(),
            "message 0: an image is not one",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "system": None,
                    "params": {},
                    "messages": [{"role": "user", "content": "", "images": ["*"]}],
                }
            ).encode(),
            "message 0: an image is not one",
        ),
    ],
)
def test_malformed_saved_chats_are_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        read_saved(path)


def test_oversized_and_missing_saved_chats(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (65 * 1024 * 1024))
    with pytest.raises(UsageError, match="more than a chat file may be"):
        read_saved(big)
    with pytest.raises(UsageError, match="no saved chat named 'nope'"):
        read_saved(tmp_path / "nope.json")


def test_markdown_blocks_end_at_blank_lines_outside_fences() -> None:
    assert block_end("# Title\n\nmore") == len("# Title\n\n")
    assert block_end("para still going") is None
    assert block_end("```\ncode\n\nmore code\n") is None  # inside a fence
    text = "```\na\n\nb\n```\n\nafter"
    assert block_end(text) == text.index("after")


def test_triple_quote_blocks() -> None:
    lines = iter(["second line", 'third"""'])
    assert Repl._block('"""first', lambda: next(lines)) == "first\nsecond line\nthird"
    assert Repl._block('"""one line"""', lambda: "") == "one line"
