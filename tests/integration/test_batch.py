"""`llmrun batch` on the real Gemma model: equality with single runs, order, resume, bad lines, Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import interruptible, invoke

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def add(a, b):",
    "한국어 문장: 안녕하세요",
    "Water boils at",
]


def run_batch(tmp_path: Path, lines: list[str], *args: str, name: str = "out.jsonl") -> tuple[int, list[Any], str]:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / name
    code, stdout, err = invoke(["batch", str(source), "-o", str(out), "-t", "0", *args])
    records = [json.loads(line) for line in out.read_text().splitlines()] if code == 0 and out.exists() else []
    assert stdout == ""
    return code, records, err


def single(prompt: str, n: int) -> str:
    code, out, err = invoke(["run", "--json", "-t", "0", "-n", str(n), "--ctx", "2048", prompt])
    assert code == 0, err
    text: str = json.loads(out)["text"]
    return text


def test_one_at_a_time_equals_single_runs_exactly(gemma: Path, tmp_path: Path) -> None:
    code, records, err = run_batch(tmp_path, PROMPTS, "-n", "16", "--parallel", "1")
    assert code == 0, err
    assert [r["id"] for r in records] == [1, 2, 3, 4, 5]
    for prompt, record in zip(PROMPTS, records, strict=True):
        assert record["text"] == single(prompt, 16)
        assert record["tokens"]["generated"] == 16 and record["stop_reason"] == "length"


def test_parallel_keeps_order_and_each_sequence_is_independent(gemma: Path, tmp_path: Path) -> None:
    code, first, err = run_batch(tmp_path, PROMPTS * 2, "-n", "12", "--parallel", "4", name="a.jsonl")
    assert code == 0, err
    assert [r["id"] for r in first] == list(range(1, 11))
    assert "10 of 10 prompts answered" in err
    _, again, _ = run_batch(tmp_path, PROMPTS * 2, "-n", "12", "--parallel", "4", name="b.jsonl")
    assert [r["text"] for r in again] == [r["text"] for r in first]  # deterministic
    # the same prompt in the same slot with different companions of equal length: the same answer
    target = "My favourite animal is the"
    _, one, _ = run_batch(tmp_path, [target, "Once upon a time there", "The quick brown fox jumps"], "-n", "24",
                          "--parallel", "3", name="c.jsonl")  # fmt: skip
    _, two, _ = run_batch(tmp_path, [target, "I went to the store", "She opened the old door"], "-n", "24",
                          "--parallel", "3", name="d.jsonl")  # fmt: skip
    assert one[0]["text"] == two[0]["text"]


def test_jsonl_overrides_messages_and_bad_lines(gemma: Path, tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "short", "prompt": "Hello", "max_tokens": 3}),
        "{not json",
        json.dumps({"id": "chat", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 5}),
        json.dumps({"id": "hot", "prompt": "x", "temperature": -1}),
        json.dumps({"id": "long", "prompt": "word " * 3000}),
        json.dumps({"id": "seeded", "prompt": "Once", "temperature": 0.9, "seed": 5, "max_tokens": 6}),
        json.dumps({"id": "short", "prompt": "again"}),
    ]
    code, records, err = run_batch(tmp_path, lines, "-n", "8", "--parallel", "2")
    assert code == 0, err
    assert [r["id"] for r in records] == ["short", "chat", "seeded"]
    assert records[0]["tokens"]["generated"] == 3 and records[1]["tokens"]["generated"] <= 5
    assert records[2]["seed"] == 5
    assert "in.txt:2: not valid JSON" in err
    assert "line 4 (id hot): temperature must be >= 0" in err
    assert "line 5 (id long): the prompt is" in err and "context holds 2048" in err
    assert "in.txt:7: id 'short' appears twice" in err
    code, _, err = run_batch(tmp_path, lines, "--strict", name="strict.jsonl")
    assert code == 2 and "in.txt:2: not valid JSON" in err


def test_resume_skips_finished_ids_and_repairs_a_torn_line(gemma: Path, tmp_path: Path) -> None:
    code, full, _ = run_batch(tmp_path, PROMPTS, "-n", "8", "--parallel", "2", name="full.jsonl")
    assert code == 0
    partial = tmp_path / "partial.jsonl"
    kept = (tmp_path / "full.jsonl").read_text().splitlines()[:2]
    partial.write_text("\n".join(kept) + '\n{"id": 3, "text": "half a li')
    code, _, err = run_batch(tmp_path, PROMPTS, "-n", "8", "--parallel", "2", name="partial.jsonl")
    assert code == 2 and "--resume" in err
    code, resumed, err = run_batch(tmp_path, PROMPTS, "-n", "8", "--parallel", "2", "--resume", name="partial.jsonl")
    assert code == 0, err
    assert "resuming: 2 of 5 already" in err
    assert [r["id"] for r in resumed] == [1, 2, 3, 4, 5]
    assert [r["text"] for r in resumed] == [r["text"] for r in full]


def test_ctrl_c_leaves_a_valid_prefix_and_exits_130(gemma: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(f"Story number {i}:" for i in range(40)) + "\n")
    out = tmp_path / "out.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "llmrun", "batch", str(source), "-o", str(out), "-n", "48", "--parallel", "2"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interruptible,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 2):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    lines = out.read_text().splitlines()
    assert 2 <= len(lines) < 40
    assert [json.loads(line)["id"] for line in lines] == list(range(1, len(lines) + 1))
    assert b"Traceback" not in err
