"""CI's smoke run of every fuzz harness: a few seconds of coverage-guided fuzzing each (atheris),
from the committed seeds, under the harness's memory and time limits; a finding fails the test
with the input libFuzzer saved. Long runs: see fuzz/README.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_fuzz_inputs import FUZZ, HARNESSES

pytestmark = pytest.mark.slow
SECONDS = 4  # per harness (ten of them); the long runs are fuzz/README.md's


@pytest.mark.parametrize("name", HARNESSES)
def test_a_short_fuzz_run_finds_nothing(name: str, tmp_path: Path) -> None:
    found, corpus = tmp_path / "found", tmp_path / "corpus"
    found.mkdir()
    corpus.mkdir()
    seeds = sorted(p.name for p in (FUZZ / "corpus" / name).iterdir())
    run = subprocess.run(
        [
            sys.executable,
            str(FUZZ / f"fuzz_{name}.py"),
            str(corpus),  # new inputs go here, never into the committed seeds
            str(FUZZ / "corpus" / name),
            f"-max_total_time={SECONDS}",
            f"-artifact_prefix={found}/",
        ],
        capture_output=True,
        text=True,
        timeout=SECONDS + 60,
        check=False,
        cwd=tmp_path,
    )
    saved = [p.name for p in found.iterdir()]
    assert run.returncode == 0 and not saved, run.stderr[-3000:]
    assert "DONE" in run.stderr
    assert sorted(p.name for p in (FUZZ / "corpus" / name).iterdir()) == seeds  # the seeds are only read
    assert {p.name for p in tmp_path.iterdir()} == {"found", "corpus"}  # nothing else written where it ran
