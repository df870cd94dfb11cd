"""llama.cpp's own programs (``ggml-rpc-server``, ``llama-mtmd-cli``), built once per machine from the
llama.cpp that the installed llama-cpp-python's sdist vendors, with the quick start's CMake flags: the
references and workers the tests run beside llmrun. Nothing is committed or downloaded but the sdist."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

import pytest

from llmrun.backends.llama_build import BUILD_CMAKE

COMMON = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_OPENSSL=OFF",
    f"-DCMAKE_PROJECT_INCLUDE={BUILD_CMAKE}",  # the quick start's flags
]


def sdist(version_: str, into: Path) -> Path:
    """llama-cpp-python's source release (pip's cache, else PyPI), unpacked."""
    into.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
    got = subprocess.run(
        [*pip, f"llama-cpp-python=={version_}", "-d", str(into)],
        capture_output=True,
        text=True,
        check=False,
    )
    archives = list(into.glob("llama_cpp_python-*.tar.gz"))
    if got.returncode != 0 or not archives:
        pytest.skip(
            f"cannot download the llama-cpp-python {version_} sdist to build llama.cpp's tools: {got.stderr[-300:]}"
        )
    shutil.unpack_archive(archives[0], into)
    return into / archives[0].name.removesuffix(".tar.gz")


def built(cache: Path, prefix: str, options: Sequence[str], targets: Sequence[str]) -> Path:
    """The bin directory holding ``targets`` (the first one decides whether it is built), built with
    ``options`` beside the common ones, once per machine in ``cache/<prefix>-<version>-<flags>``."""
    from filelock import FileLock

    version_ = version("llama-cpp-python")
    flags = hashlib.sha256(BUILD_CMAKE.read_bytes()).hexdigest()[:12]
    target = cache / f"{prefix}-{version_}-{flags}"
    with FileLock(str(target) + ".lock"):
        bin_dir = target / "build" / "bin"
        if (bin_dir / targets[0]).is_file():
            return bin_dir
        shutil.rmtree(target, ignore_errors=True)
        source = sdist(version_, target / "sdist") / "vendor" / "llama.cpp"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", str(source), "-B", str(target / "build"), *generator, *COMMON, *options]
        jobs = str(os.cpu_count() or 2)
        for command in (configure, ["cmake", "--build", str(target / "build"), "-j", jobs, "--target", *targets]):
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            assert done.returncode == 0, (
                f"{' '.join(command[:3])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        shutil.rmtree(target / "sdist", ignore_errors=True)
        return bin_dir
