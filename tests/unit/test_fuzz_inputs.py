"""The fuzz harnesses' seeds and every input fuzzing found (``fuzz/regressions``), run through the
harnesses' own targets: each parser returns or raises one of llmrun's errors, nothing else."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from llmrun.errors import LlmrunError

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
HARNESSES = sorted(p.stem.removeprefix("fuzz_") for p in FUZZ.glob("fuzz_*.py"))
INPUTS = [
    (harness, path)
    for harness in HARNESSES
    for folder in ("corpus", "regressions")
    for path in sorted((FUZZ / folder / harness).glob("*"))
]


def harness(name: str) -> ModuleType:
    if str(FUZZ) not in sys.path:
        sys.path.insert(0, str(FUZZ))
    return importlib.import_module(f"fuzz_{name}")


def test_every_harness_has_seeds() -> None:
    assert len(HARNESSES) == 10
    assert {h for h, _ in INPUTS} == set(HARNESSES)


@pytest.mark.parametrize(("name", "path"), INPUTS, ids=[f"{h}/{p.name}" for h, p in INPUTS])
def test_input_ends_in_a_result_or_llmruns_own_error(name: str, path: Path) -> None:
    try:
        harness(name).one(path.read_bytes())
    except LlmrunError as exc:  # the one-line errors the CLI shows are the expected way to refuse
        assert exc.message.strip()
