"""The store's atomic, verified writes, with a small package built in the test."""

from __future__ import annotations

import hashlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmrun import files
from llmrun.errors import ModelFileError, ModelNotFound, StoreError
from llmrun.models import store

PAYLOAD = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An importable package that carries a file in two chunks, like the Gemma package."""
    name = f"fake_model_pkg_{abs(hash(tmp_path)) % 10**8}"
    root = tmp_path / "site" / name
    (root / "data").mkdir(parents=True)
    (root / "data" / "c0").write_bytes(PAYLOAD[:1000])
    (root / "data" / "c1").write_bytes(PAYLOAD[1000:])
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    (root / "__init__.py").write_text(
        "from pathlib import Path\n"
        "MODEL_NAME = 'fake.gguf'\n"
        f"EXPECTED_SHA256 = '{sha}'\n"
        "def chunk_paths():\n"
        "    d = Path(__file__).parent / 'data'\n"
        "    return [d / 'c0', d / 'c1']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield name, root
    sys.modules.pop(name, None)


def test_assembles_once_and_verifies(package: tuple[str, Path], tmp_path: Path) -> None:
    name, _ = package
    target = store.ensure_embedded(name, tmp_path / "store")
    assert target.read_bytes() == PAYLOAD
    assert store.is_verified(target, hashlib.sha256(PAYLOAD).hexdigest())
    mtime = target.stat().st_mtime_ns
    assert store.ensure_embedded(name, tmp_path / "store") == target
    assert target.stat().st_mtime_ns == mtime  # not rewritten


def test_a_damaged_copy_is_replaced(package: tuple[str, Path], tmp_path: Path) -> None:
    name, _ = package
    target = store.ensure_embedded(name, tmp_path / "store")
    with target.open("r+b") as handle:
        handle.seek(10)
        handle.write(b"\xff")
    assert store.ensure_embedded(name, tmp_path / "store").read_bytes() == PAYLOAD


def test_a_corrupt_package_leaves_nothing_behind(package: tuple[str, Path], tmp_path: Path) -> None:
    name, root = package
    (root / "data" / "c1").write_bytes(b"tampered")
    with pytest.raises(ModelFileError, match="sha256"):
        store.ensure_embedded(name, tmp_path / "store")
    assert list((tmp_path / "store").iterdir()) == []


def test_missing_package_says_how_to_install() -> None:
    with pytest.raises(ModelNotFound, match="not installed") as info:
        store.ensure_embedded("no_such_model_package_xyz", Path("/nonexistent"))
    assert "pip install no-such-model-package-xyz" in info.value.hint


def test_not_enough_disk_space_is_refused_before_writing(
    package: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _ = package
    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10, 10, 5))  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match="not enough disk space"):
        store.ensure_embedded(name, tmp_path / "store")
    assert not (tmp_path / "store" / "fake.gguf").exists()


def test_atomic_output_removes_the_partial_file_on_error(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError), files.atomic_output(target) as handle:
        handle.write(b"half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_partials_of_dead_processes_are_cleaned(tmp_path: Path) -> None:
    dead = tmp_path / f"{files.PARTIAL_PREFIX}999999999-abc"
    dead.write_bytes(b"x")
    import os

    alive = tmp_path / f"{files.PARTIAL_PREFIX}{os.getpid()}-abc"
    alive.write_bytes(b"x")
    files.clean_partials(tmp_path)
    assert not dead.exists() and alive.exists()
