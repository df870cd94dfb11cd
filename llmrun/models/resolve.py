"""From a :class:`ModelRef` to the local file that runs it.

Today: registry aliases backed by an embedded package, and local paths. Hub
repos are the seam for ``llmrun pull`` (the registry issue): they resolve to a
clear error until then.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import ModelFileError, ModelNotFound
from llmrun.files import Progress
from llmrun.models.refs import ModelRef
from llmrun.models.registry import ModelEntry, Registry
from llmrun.models.store import ensure_embedded
from llmrun.paths import store_dir

if TYPE_CHECKING:
    from llmrun.models.otherstores import ForeignModel


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    name: str  # what to call it in output: the alias, or the path as given
    path: Path  # the local GGUF file, or MLX directory
    entry: ModelEntry | None  # its models.toml entry, when it has one
    detail: str = ""  # what was chosen or fetched, for the user
    foreign: ForeignModel | None = None  # a model in another tool's store, with the defaults it keeps
    mmproj: Path | None = None  # the projector pulled with it (a vision model's mmproj GGUF from its repo)

    @property
    def projector(self) -> tuple[Path, str] | None:
        """The projector the model's own listing names, and where from: its models.toml entry's ``mmproj``,
        the one pulled with it from its repo, an MLX vision model's own vision tower, or the other store's
        (Ollama's projector layer, the file beside it in LM Studio or the Hugging Face cache). None: it reads
        no images unless given one."""
        if self.entry is not None and self.entry.mmproj is not None:
            return self.entry.mmproj, f"models.toml ({self.entry.source})"
        if self.mmproj is not None:
            return self.mmproj, "pulled with the model"
        if self.path.is_dir():
            from llmrun.formats.mlx_header import has_vision_tower

            if has_vision_tower(self.path):
                return self.path, "the MLX model's own vision tower"
        if self.foreign is not None and self.foreign.mmproj is not None:
            return self.foreign.mmproj, f"{self.foreign.source}'s projector"
        return None


def resolve(
    ref: ModelRef, registry: Registry, progress: Progress | None = None, backend: str = "gguf", mmproj: bool = True
) -> ResolvedModel:
    """The local files of ``ref`` in the form ``backend`` runs (a GGUF file, or an MLX directory); a GGUF
    pulled from a repo with a projector brings it (``mmproj=False``: not when it is first pulled)."""
    if ref.kind == "hub" and ref.file and Path(ref.text).is_file():
        ref = ModelRef("path", ref.text, ref.text)  # a local dir/sub/file.gguf, not a repo file
    if ref.kind in ("ollama", "lmstudio"):
        from llmrun.models.otherstores import lmstudio_model, ollama_model

        found = ollama_model(ref.name) if ref.kind == "ollama" else lmstudio_model(ref.name)
        return ResolvedModel(found.name, found.path, None, f"in {found.source}'s store, run in place", found)
    if ref.kind == "path":
        path = Path(ref.name).expanduser()
        if not path.exists():
            raise ModelFileError(f"model file {path} does not exist", "check the path")
        return ResolvedModel(ref.name, path, None)
    from llmrun.models import pull

    made = pull.made_here_as(ref, registry)
    if made is not None:  # quantized or converted here, under this name
        return ResolvedModel(ref.name, made[0], None, f"{ref.name} was made on this machine")
    if backend == "mlx":
        return _resolve_mlx(ref, registry, progress)
    if ref.kind == "hub":
        key = f"{ref.name}/{ref.file}" if ref.file else f"{ref.name}:{ref.tag}" if ref.tag else ref.name
        cached = _in_huggingface_cache(key) if ref.file and pull.local(key) is None else None
        if cached is not None:  # another tool pulled it into the Hugging Face cache: run it there
            return cached
        path, detail = pull.fetch(key, ref.name, quant=ref.tag, file=ref.file, progress=progress, mmproj=mmproj)
        return ResolvedModel(key, path, None, detail, mmproj=pull.projector(key))
    entry, quant = _alias(ref, registry)
    if entry.embedded:
        path = ensure_embedded(entry.embedded, store_dir() / "embedded", progress)
        return ResolvedModel(entry.name, path, entry)
    if entry.package and (quant is None or entry.gguf is None):
        from llmrun.models import hub
        from llmrun.models.packaged import ensure_packaged, locate

        if locate(entry.package) is not None or entry.gguf is None or hub.offline():
            pullable = entry.gguf is not None
            path = ensure_packaged(entry.name, entry.package, store_dir() / "packaged", progress, pullable=pullable)
            return ResolvedModel(entry.name, path, entry, f"from the package {entry.package.install}")
    if entry.gguf is None:
        raise ModelNotFound(f"{entry.name} has no GGUF source in models.toml", "add a gguf = { repo, files } table")
    files = entry.gguf.files
    quant = quant or _default_quant(files)
    file = files.get(quant) if quant else None
    key = entry.name if quant is None or quant == _default_quant(files) else f"{entry.name}-{quant.lower()}"
    wanted: bool | str = mmproj and (entry.gguf.mmproj or True)
    path, detail = pull.fetch(
        key, entry.gguf.repo, quant=None if file else quant, file=file, progress=progress, mmproj=wanted
    )
    return ResolvedModel(key, path, entry, detail, mmproj=pull.projector(key))


def _in_huggingface_cache(key: str) -> ResolvedModel | None:
    from llmrun.models.otherstores import huggingface_model

    found = huggingface_model(key)
    return ResolvedModel(key, found.path, None, "in the Hugging Face cache, run in place", found) if found else None


def _resolve_mlx(ref: ModelRef, registry: Registry, progress: Progress | None) -> ResolvedModel:
    from llmrun.models import pull

    if ref.kind == "hub":
        path, detail = pull.fetch_mlx(ref.name, ref.name, progress=progress)
        return ResolvedModel(ref.name, path, None, detail)
    entry = registry.get(ref.name)
    bits: str | None = None
    if entry is None:  # name-q8 → the 8-bit MLX repo
        base, _, suffix = ref.name.rpartition("-")
        entry = registry.get(base) if base else None
        bits = suffix.lstrip("qQ").split("_")[0] if entry is not None else None
    if entry is None:
        raise _unknown_alias(ref, registry)
    if not entry.mlx:
        raise ModelNotFound(f"{entry.name} has no MLX source in models.toml", 'add mlx = { "4" = "owner/repo" }')
    bits = bits or ("4" if "4" in entry.mlx else sorted(entry.mlx)[0])
    if bits not in entry.mlx:
        raise ModelNotFound(f"{entry.name} has no {bits}-bit MLX source", f"available: {', '.join(entry.mlx)} bit")
    key = f"{entry.name}-mlx-{bits}bit"
    path, detail = pull.fetch_mlx(key, entry.mlx[bits], progress=progress)
    return ResolvedModel(key, path, entry, detail)


def _default_quant(files: dict[str, str]) -> str | None:
    return "Q4_K_M" if "Q4_K_M" in files else next(iter(files), None)


def _alias(ref: ModelRef, registry: Registry) -> tuple[ModelEntry, str | None]:
    """The entry for ``name``, or for ``name`` minus a ``-q8``-style quant suffix."""
    entry = registry.get(ref.name)
    if entry is not None:
        return entry, None
    base, _, suffix = ref.name.rpartition("-")
    entry = registry.get(base) if base else None
    if entry is not None and entry.gguf is not None:
        matches = [q for q in entry.gguf.files if q.lower() == suffix or q.lower().startswith(suffix + "_")]
        if matches:
            return entry, matches[0]
        raise ModelNotFound(
            f"{entry.name} has no {suffix.upper()} file in models.toml",
            f"available: {', '.join(entry.gguf.files)}",
        )
    raise _unknown_alias(ref, registry)


def _unknown_alias(ref: ModelRef, registry: Registry) -> ModelNotFound:
    if Path(ref.text).exists():  # names never become paths by themselves; say how to mean the path
        return ModelNotFound(f"unknown model {ref.text!r}", f"for the local path, write ./{ref.text}")
    close = difflib.get_close_matches(ref.name, list(registry.models), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known models: {', '.join(sorted(registry.models))}"
    return ModelNotFound(f"unknown model {ref.text!r}", hint)


# --- choosing files in a repo (pure) ----------------------------------------------
