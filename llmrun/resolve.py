"""From a :class:`ModelRef` to the local file that runs it.

Today: registry aliases backed by an embedded package, and local paths. Hub
repos are the seam for ``llmrun pull`` (the registry issue): they resolve to a
clear error until then.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmrun.config import ModelEntry, Registry, store_dir
from llmrun.errors import ModelFileError, ModelNotFound
from llmrun.refs import ModelRef
from llmrun.store import ensure_embedded


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    name: str  # what to call it in output: the alias, or the path as given
    path: Path  # the local GGUF file
    entry: ModelEntry | None  # its models.toml entry, when it has one


def resolve(ref: ModelRef, registry: Registry, progress: Callable[[int], None] | None = None) -> ResolvedModel:
    if ref.kind == "hub" and ref.file and Path(ref.text).is_file():
        ref = ModelRef("path", ref.text, ref.text)  # a local dir/sub/file.gguf, not a repo file
    if ref.kind == "path":
        path = Path(ref.name).expanduser()
        if not path.exists():
            raise ModelFileError(f"model file {path} does not exist", "check the path")
        return ResolvedModel(ref.name, path, None)
    if ref.kind == "hub":
        raise ModelNotFound(
            f"{ref.text}: downloading from the Hugging Face Hub is not available yet",
            "download the .gguf file and pass its path with -m",
        )
    entry = registry.get(ref.name)
    if entry is None:
        raise _unknown_alias(ref, registry)
    if entry.embedded:
        path = ensure_embedded(entry.embedded, store_dir() / "embedded", progress)
        return ResolvedModel(entry.name, path, entry)
    raise ModelNotFound(
        f"{entry.name} is not downloaded and this version cannot pull from the Hub yet",
        "download its .gguf file and pass the path with -m",
    )


def _unknown_alias(ref: ModelRef, registry: Registry) -> ModelNotFound:
    close = difflib.get_close_matches(ref.name, list(registry.models), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known models: {', '.join(sorted(registry.models))}"
    return ModelNotFound(f"unknown model {ref.text!r}", hint)
