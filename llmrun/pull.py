"""Getting a model's files onto this machine, verified, and recording them in the index.

A model already in the index, with its files present and the right size, is used as is
(no network). Otherwise the repo's file listing gives the files (for a quant) and their
sha256; each file is downloaded into the Hugging Face cache (resuming a partial download),
verified, and the model is recorded. Offline, only what is already here can be used.
"""

from __future__ import annotations

import time
from pathlib import Path

from llmrun import hub
from llmrun.errors import ModelNotFound
from llmrun.resolve import choose
from llmrun.store import Progress, editing_index, read_index

MLX_FILES = ("*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken")
"""What an MLX model directory needs (mlx-lm's own download patterns; never *.py: no remote code)."""


def local(key: str) -> Path | None:
    """The model's path (its first file; an MLX model's directory) when all its files are present and whole."""
    entry = read_index().get(key)
    if not entry:
        return None
    paths = [Path(f["path"]) for f in entry["files"]]
    sizes_ok = all(p.is_file() and p.stat().st_size == f["size"] for p, f in zip(paths, entry["files"], strict=True))
    if not (paths and sizes_ok):
        return None
    return paths[0].parent if entry.get("format") == "mlx" else paths[0]


def fetch_mlx(
    key: str, repo: str, *, revision: str | None = None, progress: Progress | None = None
) -> tuple[Path, str]:
    """The local directory of an MLX repo (pulling its model files if needed)."""
    import fnmatch

    found = local(key)
    if found is not None:
        return found, f"{key} is already here"
    _need_online(key)
    commit, remote = hub.list_files(repo, revision)
    chosen = [f for f in remote if "/" not in f.name and any(fnmatch.fnmatch(f.name, p) for p in MLX_FILES)]
    if not any(f.name == "config.json" for f in chosen) or not any(f.name.endswith(".safetensors") for f in chosen):
        raise ModelNotFound(f"{repo} is not an MLX model repo (no config.json and *.safetensors)", "check the name")
    paths = [hub.download(repo, f, commit, progress) for f in chosen]
    _record(key, repo, commit, None, [(f.name, f.sha256, f.size, p) for f, p in zip(chosen, paths, strict=True)], "mlx")
    return paths[0].parent, f"{repo}: {len(chosen)} files (MLX)"


def _need_online(key: str) -> None:
    if hub.offline():
        raise ModelNotFound(
            f"{key} is not downloaded and llmrun is offline",
            "pull it while online (without --offline or HF_HUB_OFFLINE=1)",
        )


def _record(
    key: str, repo: str, commit: str, quant: str | None, files: list[tuple[str, str | None, int, Path]], form: str
) -> None:
    record = {
        "repo": repo,
        "revision": commit,
        "quant": quant,
        "format": form,
        "files": [{"name": n, "sha256": sha, "size": size, "path": str(path)} for n, sha, size, path in files],
        "pulled": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with editing_index() as models:
        models[key] = record


def fetch(
    key: str,
    repo: str,
    *,
    quant: str | None = None,
    file: str | None = None,
    revision: str | None = None,
    progress: Progress | None = None,
) -> tuple[Path, str]:
    """The local path of ``key`` (pulling it if needed) and a line saying what was chosen."""
    found = local(key)
    if found is not None:
        return found, f"{key} is already here"
    _need_online(key)
    commit, remote = hub.list_files(repo, revision)
    names = [f.name for f in remote]
    if file is not None:
        if file not in names:
            raise ModelNotFound(f"{repo} has no file {file}", "run `llmrun pull " + repo + "` to see what it has")
        chosen, why = [file], f"{file} as named"
    else:
        chosen, why = choose(names, quant)
    by_name = {f.name: f for f in remote}
    paths = [hub.download(repo, by_name[name], commit, progress) for name in chosen]
    files = [(n, by_name[n].sha256, by_name[n].size, p) for n, p in zip(chosen, paths, strict=True)]
    _record(key, repo, commit, quant, files, "gguf")
    return paths[0], f"{repo}: {why}"


def remove(key: str) -> list[Path]:
    """Forget ``key`` and delete its files (only its own: files another entry uses stay)."""
    with editing_index() as models:
        entry = models.pop(key, None)
        if entry is None:
            raise ModelNotFound(f"{key} is not in the local store", "`llmrun list` shows what is")
        still_used = {f["path"] for other in models.values() for f in other["files"]}
    removed = []
    for f in entry["files"]:
        if f["path"] not in still_used:
            hub.remove(Path(f["path"]))
            removed.append(Path(f["path"]))
    return removed
