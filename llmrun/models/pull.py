"""Getting a model's files onto this machine, verified, and recording them in the index.

A model already in the index, with its files present and the right size, is used as is
(no network). Otherwise the repo's file listing gives the files (for a quant) and their
sha256; each file is downloaded into the Hugging Face cache (resuming a partial download),
verified, and the model is recorded. Offline, only what is already here can be used.
"""

from __future__ import annotations

import contextlib
import fnmatch
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.errors import ModelFileError, ModelNotFound, StoreError
from llmrun.files import Progress
from llmrun.models import hub
from llmrun.models.quants import choose, choose_projector
from llmrun.models.store import editing_index, entry_files, read_index

if TYPE_CHECKING:
    from llmrun.models.refs import ModelRef
    from llmrun.models.registry import Registry

MLX_FILES = ("*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken")
"""What an MLX model directory needs (mlx-lm's own download patterns; never *.py: no remote code)."""


def local(key: str) -> Path | None:
    """The model's first file when all its files are present and whole (an MLX model's directory is its parent)."""
    entry = read_index().get(key)
    return _present(entry) if entry else None


def projector(key: str) -> Path | None:
    """The projector pulled with ``key`` (a vision model's mmproj GGUF), when it is here and whole."""
    entry = read_index().get(key)
    recorded = entry.get("mmproj") if entry else None
    return _present({"files": [recorded]}) if recorded else None


def _present(entry: dict[str, Any]) -> Path | None:
    records = entry_files(entry)
    paths = [Path(f["path"]) for f in records]
    sizes_ok = all(p.is_file() and p.stat().st_size == f["size"] for p, f in zip(paths, records, strict=True))
    return paths[0] if paths and sizes_ok else None


Chooser = Callable[[list[hub.RemoteFile]], tuple[list[str], str]]  # files to fetch, and why
ProjectorChooser = Callable[[list[hub.RemoteFile]], tuple[str | None, str]]  # the projector to fetch, and why


def fetch_mlx(
    key: str, repo: str, *, revision: str | None = None, progress: Progress | None = None
) -> tuple[Path, str]:
    """The local directory of an MLX repo (pulling its model files if needed)."""
    path, detail = _pull(key, repo, revision, progress, _mlx_files, None, "mlx")
    return path.parent, detail


def fetch(
    key: str,
    repo: str,
    *,
    quant: str | None = None,
    file: str | None = None,
    revision: str | None = None,
    progress: Progress | None = None,
    mmproj: bool | str = True,
) -> tuple[Path, str]:
    """The local path of ``key`` (pulling it if needed) and a line saying what was chosen. ``mmproj``: fetch
    the repo's projector with the model (True: the one :func:`choose_projector` picks, when it has one; a
    name: that file; False: none), as llama.cpp's ``-hf`` does, so a vision model reads images as pulled."""

    def gguf_files(remote: list[hub.RemoteFile]) -> tuple[list[str], str]:
        names = [f.name for f in remote]
        if file is None:
            return choose(names, quant)
        if file not in names:
            raise ModelNotFound(f"{repo} has no file {file}", "run `llmrun pull " + repo + "` to see what it has")
        return [file], f"{file} as named"

    def projector_file(remote: list[hub.RemoteFile]) -> tuple[str | None, str]:
        if mmproj is False:
            return None, ""
        if isinstance(mmproj, str):
            if mmproj not in {f.name for f in remote}:
                raise ModelNotFound(f"{repo} has no projector {mmproj}", "check the gguf.mmproj name in models.toml")
            return mmproj, f"projector {mmproj}"
        return choose_projector([f.name for f in remote])

    return _pull(key, repo, revision, progress, gguf_files, quant, "gguf", projector_file)


def _mlx_files(remote: list[hub.RemoteFile]) -> tuple[list[str], str]:
    chosen = [f.name for f in remote if "/" not in f.name and any(fnmatch.fnmatch(f.name, p) for p in MLX_FILES)]
    if "config.json" not in chosen or not any(name.endswith(".safetensors") for name in chosen):
        raise ModelNotFound("the repo is not an MLX model (no config.json and *.safetensors)", "check the name")
    return chosen, f"{len(chosen)} files (MLX)"


def _pull(
    key: str,
    repo: str,
    revision: str | None,
    progress: Progress | None,
    pick: Chooser,
    quant: str | None,
    form: str,
    pick_projector: ProjectorChooser | None = None,
) -> tuple[Path, str]:
    """Index first (no network when the files are here), then list, choose, download, verify, record
    (the projector after the model's files, so a model is recorded only with everything it was pulled with)."""
    found = local(key)
    if found is not None:
        return found, f"{key} is already here"
    if hub.offline():
        raise ModelNotFound(
            f"{key} is not downloaded and llmrun is offline",
            "pull it while online (without `offline` or HF_HUB_OFFLINE=1)",
        )
    commit, remote = hub.list_files(repo, revision)
    chosen, why = pick(remote)
    extra, extra_why = pick_projector(remote) if pick_projector else (None, "")
    by_name = {f.name: f for f in remote}
    paths = [hub.download(repo, by_name[name], commit, progress) for name in chosen]
    projector_path = hub.download(repo, by_name[extra], commit, progress) if extra else None
    record: dict[str, Any] = {
        "repo": repo,
        "revision": commit,
        "quant": quant,
        "format": form,
        "files": [
            {"name": n, "sha256": by_name[n].sha256, "size": by_name[n].size, "path": str(path)}
            for n, path in zip(chosen, paths, strict=True)
        ],
        "pulled": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if extra and projector_path:
        listed = by_name[extra]
        record["mmproj"] = {"name": extra, "sha256": listed.sha256, "size": listed.size, "path": str(projector_path)}
        why += f", with its {extra_why}"
    with editing_index() as models:
        models[key] = record
    return paths[0], f"{repo}: {why}"


def remove(key: str) -> list[Path]:
    """Forget ``key`` and delete its files (only its own: files another entry uses stay, and a
    model made here with -o outside the store is only forgotten, never deleted)."""
    from llmrun.paths import store_dir

    with editing_index() as models:
        entry = models.pop(key, None)
        if entry is None:
            raise ModelNotFound(f"{key} is not in the local store", "`llmrun list` shows what is")
        still_used = {f["path"] for other in models.values() for f in entry_files(other)}
    removed = []
    store = store_dir().resolve()
    for f in entry_files(entry):
        path = Path(f["path"])
        if f["path"] in still_used or (entry.get("origin") == LOCAL and not path.resolve().is_relative_to(store)):
            continue
        hub.remove(path)
        removed.append(path)
    if entry.get("origin") == LOCAL and entry.get("format") == "mlx" and removed:
        with contextlib.suppress(OSError):
            removed[0].parent.rmdir()  # the directory, once empty
    return removed


# --- models made on this machine (llmrun quantize) ------------------------------------

LOCAL = "local"


def register_local(key: str, path: Path, form: str, *, source: str, source_path: Path, quant: str) -> None:
    """Record a model written here (a GGUF file, or an MLX directory), its files hashed."""
    from llmrun.files import sha256_file

    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    if form == "mlx":
        files.sort(key=lambda p: p.name != "config.json")
    records = []
    for file in files:
        size, where = file.stat().st_size, str(file.absolute())
        records.append({"name": file.name, "sha256": sha256_file(file), "size": size, "path": where})
    record = {
        "repo": None,
        "origin": LOCAL,
        "source": source,
        "source_path": str(source_path.absolute()),
        "revision": None,
        "quant": quant,
        "format": form,
        "files": records,
        "pulled": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with editing_index() as models:
        models[key] = record


def made_here_as(ref: ModelRef, registry: Registry) -> tuple[Path, str] | None:
    """:func:`made_here` for a parsed name; a damaged index stops only the names that could be
    in it, not those models.toml knows (their pulled copies still need it, and say so)."""
    if ref.kind != "alias":
        return None
    try:
        return made_here(ref.name)
    except StoreError:
        if registry.get(ref.name) or registry.get(ref.name.rpartition("-")[0]):
            return None
        raise


def made_here(key: str) -> tuple[Path, str] | None:
    """A model :func:`register_local` recorded: its file or directory, and its format."""
    entry = read_index().get(key)
    if not entry or entry.get("origin") != LOCAL:
        return None
    found = _present(entry)
    if found is None:
        raise ModelFileError(
            f"the files of {key} are missing or changed since it was made",
            f"make it again (llmrun quantize … --name {key} --force), or forget it: llmrun rm {key}",
        )
    return (found.parent if entry.get("format") == "mlx" else found), str(entry.get("format", "gguf"))
