"""Batch input parsing and ordered, resumable output (no model)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from llmrun.api.batch import Item, LineError, OrderedWriter, finished_ids, parse
from llmrun.errors import UsageError


def test_text_lines_are_prompts_numbered_by_line() -> None:
    items = list(parse(["first\n", "\n", "third\n"]))
    assert items == [Item(1, "1", prompt="first"), Item(3, "3", prompt="third")]
    assert [i.output_id for i in items if isinstance(i, Item)] == [1, 3]


def test_jsonl_items_and_errors() -> None:
    lines = [
        '{"id": 7, "prompt": "a", "max_tokens": 4}',
        '{"id": "x", "messages": [{"role": "user", "content": "hi"}]}',
        "[1, 2]",
        '{"prompt": "a", "messages": []}',
        '{"id": "y", "prompt": "b", "colour": "red"}',
        '{"id": "z", "messages": [{"role": "root", "content": "hi"}]}',
        '{"id": 7, "prompt": "dup"}',
    ]
    result = list(parse(lines))
    assert result[0] == Item(1, "7", prompt="a", overrides={"max_tokens": 4}, raw_id=7)
    assert isinstance(result[1], Item) and result[1].messages == (("user", "hi"),)
    errors = [(r.line, r.message) for r in result if isinstance(r, LineError)]
    assert [line for line, _ in errors] == [3, 4, 5, 6, 7]
    assert "expected a JSON object" in errors[0][1]
    assert "not both" in errors[1][1]
    assert "unknown keys ['colour']" in errors[2][1]
    assert "role" in errors[3][1]
    assert "appears twice" in errors[4][1]


def test_writer_keeps_input_order_and_skips_failed_ids() -> None:
    out = io.StringIO()
    writer = OrderedWriter(out, ["a", "b", "c", "d"])
    writer.add("b", {"id": "b"})
    assert out.getvalue() == ""  # waits for a
    writer.add("a", {"id": "a"})
    writer.add("c", None)  # failed: no line, no waiting
    writer.add("d", {"id": "d"})
    assert [json.loads(line)["id"] for line in out.getvalue().splitlines()] == ["a", "b", "d"]


def test_finished_ids_cut_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"id": 1, "text": "a"}\n{"id": "b", "text": "b"}\n{"id": 3, "te')
    assert finished_ids(path) == {"1", "b"}
    assert path.read_text().endswith('"b"}\n')
    path.write_text("not json\n")
    with pytest.raises(UsageError, match="not a batch result line"):
        finished_ids(path)
    assert finished_ids(tmp_path / "none.jsonl") == set()
