"""The only importer of huggingface_hub: list a repo's files, download one with progress, verify it.

Files land in the standard Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``), so
other tools reuse ours and we reuse theirs. ``HF_ENDPOINT``, ``HF_TOKEN`` and
``HF_HUB_OFFLINE`` are read when a call is made (huggingface_hub reads some of them once, at
import). huggingface_hub checks a download's size; we check its sha256 against the Hub's
LFS record, and delete a file that does not match.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrun.errors import LlmrunError, ModelFileError, ModelNotFound
from llmrun.files import check_free_space, sha256_file

Progress = Callable[[str, int, int], None]  # file name, bytes done, total bytes


class HubError(LlmrunError):
    """The Hub could not be reached or refused a request."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # None for small files kept in git, not LFS


def endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def cache_dir() -> Path:
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _quiet() -> None:
    """huggingface_hub's own retry warnings would interleave with our progress; we report failures."""
    import logging

    from huggingface_hub.utils import logging as hf_logging

    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # --debug shows them
        hf_logging.set_verbosity_error()


def list_files(repo: str, revision: str | None = None) -> tuple[str, list[RemoteFile]]:
    """The commit and the files of a model repo (with sizes and LFS sha256)."""
    from huggingface_hub import HfApi

    _quiet()
    if offline():
        raise HubError(f"cannot list {repo}: offline (HF_HUB_OFFLINE is set)", "pull it while online first")
    try:
        info = HfApi(endpoint=endpoint()).model_info(repo, revision=revision, files_metadata=True)
    except Exception as exc:
        raise _translate(exc, repo) from exc
    files = [
        RemoteFile(s.rfilename, int(s.size or 0), s.lfs.sha256 if s.lfs is not None else None)
        for s in info.siblings or []
    ]
    return str(info.sha), files


def download(repo: str, file: RemoteFile, revision: str | None = None, progress: Progress | None = None) -> Path:
    """Download (or reuse, or resume) one file into the HF cache and verify its sha256."""
    from huggingface_hub import hf_hub_download

    _quiet()
    target = cache_dir()
    check_free_space(target, file.size, f"{repo}/{file.name}")
    try:
        path = Path(
            hf_hub_download(
                repo,
                file.name,
                revision=revision,
                cache_dir=target,
                endpoint=endpoint(),
                local_files_only=offline(),
                tqdm_class=_reporter(lambda _, done, total: progress(file.name, done, total)) if progress else None,
            )
        )
    except Exception as exc:
        raise _translate(exc, repo, file.name) from exc
    _clean_partials(path)
    if file.sha256 and sha256_file(path) != file.sha256:
        _delete(path)
        raise ModelFileError(
            f"{repo}/{file.name} does not match the sha256 the Hub published; the download was deleted",
            "pull it again; if it keeps failing, the mirror or the network is corrupting it",
        )
    return path


def cached(repo: str, name: str, revision: str | None = None) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, name, cache_dir=cache_dir(), revision=revision)
    return Path(found) if isinstance(found, str) else None


def remove(path: Path) -> None:
    """Delete a cached file: its snapshot link and the blob behind it."""
    _delete(path)


def _delete(path: Path) -> None:
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path:
        blob.unlink(missing_ok=True)


def _clean_partials(path: Path) -> None:
    """Partial downloads of this blob left by pulls that were killed (the library names each
    process's partial file uniquely, so a new pull does not pick them up)."""
    blob = path.resolve()
    for leftover in blob.parent.glob(blob.name + "*.incomplete"):
        leftover.unlink(missing_ok=True)


def _reporter(progress: Progress) -> Any:
    from tqdm.auto import tqdm

    class Reporter(tqdm):  # type: ignore[misc]
        """A silent tqdm that forwards byte counts to llmrun's renderer."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self.done = int(kwargs.get("initial") or 0)
            self.label = str(kwargs.get("desc") or "")
            progress(self.label, self.done, int(self.total or 0))

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            progress(self.label, self.done, int(self.total or 0))
            return None

    return Reporter


def _translate(exc: Exception, repo: str, name: str | None = None) -> LlmrunError:
    what = f"{repo}/{name}" if name else repo
    kind = type(exc).__name__
    if kind == "RepositoryNotFoundError":
        return ModelNotFound(f"{repo} is not on the Hub", "check the name; a private or gated repo needs HF_TOKEN")
    if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
        return ModelNotFound(f"{what} is not in the repo", "run `llmrun pull OWNER/REPO` to choose from its files")
    if kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled"):
        return HubError(f"{what} is not downloaded and the Hub cannot be reached (offline)", "pull it while online")
    if kind == "GatedRepoError":
        return HubError(f"{repo} is gated", "accept its licence on the Hub and set HF_TOKEN")
    return HubError(
        f"reaching the Hub for {what} failed: {kind}: {exc}".splitlines()[0],
        "check the network and retry; `offline` runs models already downloaded",
    )
