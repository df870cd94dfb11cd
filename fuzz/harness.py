"""What every harness shares: a sandbox and the property checked on each input.

Each input runs in a temporary directory that is also the working directory, with
``LLMRUN_HOME``, ``HOME``, ``HF_HOME``, ``OLLAMA_MODELS`` and the XDG folders inside it
(nothing can be written anywhere else), under a memory limit (``RLIMIT_AS``) and libFuzzer's
per-input time limit. The property: the parser returns, or raises one of llmrun's own errors
(:class:`llmrun.errors.LlmrunError`, the one-line errors the CLI shows); any other exception,
a hang past the time limit, or memory past the limit is a finding, and libFuzzer saves the input.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MEMORY_LIMIT = 3 * 1024**3  # address space, bytes: generous for numpy and jinja, small beside the machine
DEFAULT_FLAGS = ["-timeout=10", "-rss_limit_mb=2048", "-max_len=65536"]

SANDBOX = Path(tempfile.mkdtemp(prefix="llmrun-fuzz-"))
ISOLATED = {
    "LLMRUN_HOME": "llmrun",
    "LLMRUN_CONFIG_DIR": "config",
    "HOME": "home",
    "HF_HOME": "hf",
    "OLLAMA_MODELS": "ollama",
    "LMSTUDIO_MODELS": "lmstudio",
    "XDG_CACHE_HOME": "xdg-cache",
    "XDG_CONFIG_HOME": "xdg-config",
    "XDG_DATA_HOME": "xdg-data",
}
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def isolate() -> None:
    """Every folder llmrun (or a library under it) could write to, inside the sandbox."""
    for name, sub in ISOLATED.items():
        os.environ[name] = str(SANDBOX / sub)
    os.environ["HF_HUB_OFFLINE"] = "1"


def workdir() -> Path:
    """A fresh, empty folder for one input (the previous input's is removed)."""
    folder = SANDBOX / "input"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def as_file(data: bytes, name: str) -> Path:
    """``data`` as the file ``name`` in a fresh :func:`workdir`."""
    path = workdir() / name
    path.write_bytes(data)
    return path


SEPARATOR = b"\n--8<--\n"


def parts(data: bytes, n: int) -> list[bytes]:
    """An input holding ``n`` files, separated by :data:`SEPARATOR` (missing ones empty), so that
    seeds stay readable and libFuzzer's mutations can cross from one file to another."""
    pieces = data.split(SEPARATOR, n - 1)
    return pieces + [b""] * (n - len(pieces))


def checked(target: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """``target`` with the property: llmrun's own errors are expected; anything else propagates."""
    from llmrun.errors import LlmrunError

    def one(data: bytes) -> None:
        with contextlib.suppress(LlmrunError):  # the one-line errors: the expected refusals
            target(data)

    return one


def main(target: Callable[[bytes], None]) -> None:
    """Run ``target`` under atheris (libFuzzer) with the sandbox's limits; libFuzzer's flags pass
    through (``-runs=N``, ``-max_total_time=S``, corpus folders)."""
    import atheris

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    args = [arg if arg.startswith("-") else str(Path(arg).resolve()) for arg in sys.argv[1:]]  # corpus folders
    given = {arg.split("=")[0] for arg in args if arg.startswith("-")}
    defaults = [*DEFAULT_FLAGS, f"-artifact_prefix={os.getcwd()}/"]  # findings land where you ran it
    flags = [f for f in defaults if f.split("=")[0] not in given]
    isolate()
    os.chdir(SANDBOX)  # a relative write lands in the sandbox too
    atheris.Setup([sys.argv[0], *flags, *args], checked(target))
    atheris.Fuzz()
