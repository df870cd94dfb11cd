"""llama.cpp's ``ggml-rpc-server``, built once per machine from the llama.cpp that the installed
llama-cpp-python's sdist vendors, and started as real worker processes on 127.0.0.1.

The same build has llama.cpp's shared libraries with the RPC backend: a llama-cpp-python that was
built without it (a cached wheel from before the quick start turned it on) is pointed at them with
``LLAMA_CPP_LIB_PATH``, llama-cpp-python's own override, so the client side is tested either way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from llmrun.backends.llama_build import BUILD_CMAKE
from tests.support import serving
from tests.support.helpers import interruptible

SERVER = "ggml-rpc-server"


def _sdist(version_: str, into: Path) -> Path:
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
            f"cannot download the llama-cpp-python {version_} sdist to build ggml-rpc-server: {got.stderr[-300:]}"
        )
    shutil.unpack_archive(archives[0], into)
    return into / archives[0].name.removesuffix(".tar.gz")


def build(cache: Path) -> Path:
    """The build's bin directory (``ggml-rpc-server`` and the shared libraries), once per machine."""
    from filelock import FileLock

    version_ = version("llama-cpp-python")
    flags = hashlib.sha256(BUILD_CMAKE.read_bytes()).hexdigest()[:12]
    target = cache / f"llama-rpc-{version_}-{flags}"
    with FileLock(str(target) + ".lock"):
        bin_dir = target / "build" / "bin"
        if (bin_dir / SERVER).is_file():
            return bin_dir
        shutil.rmtree(target, ignore_errors=True)
        source = _sdist(version_, target / "sdist") / "vendor" / "llama.cpp"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", str(source), "-B", str(target / "build"), *generator]
        configure += ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_RPC=ON", "-DBUILD_SHARED_LIBS=ON"]
        configure += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
        configure += ["-DLLAMA_OPENSSL=OFF", f"-DCMAKE_PROJECT_INCLUDE={BUILD_CMAKE}"]  # the quick start's flags
        jobs = str(os.cpu_count() or 2)
        for command in (
            configure,
            ["cmake", "--build", str(target / "build"), "-j", jobs, "--target", SERVER, "llama"],
        ):
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            assert done.returncode == 0, (
                f"{' '.join(command[:3])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        shutil.rmtree(target / "sdist", ignore_errors=True)
        return bin_dir


def client_env(bin_dir: Path) -> dict[str, str]:
    """Environment for llmrun (and reference scripts): llama-cpp-python's own libraries when they have
    the RPC backend, else the ones built here."""
    import llama_cpp

    if llama_cpp.llama_supports_rpc():
        return {}
    return {"LLAMA_CPP_LIB_PATH": str(bin_dir)}


def start(bin_dir: Path, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """One worker (one thread: the machine's cores go to whoever computes) listening on a free port."""
    port = serving.free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(bin_dir / SERVER), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=interruptible,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{SERVER} exited: {log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            break  # (the connection counts as a client; the worker goes back to waiting when it closes)
        time.sleep(0.1)
    return f"127.0.0.1:{port}", process


def stop(process: subprocess.Popen[bytes]) -> None:
    serving.stop(process, signal.SIGTERM, timeout=10)


@contextlib.contextmanager
def running(bin_dir: Path, logs: Path, count: int) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    started = [start(bin_dir, logs / f"worker{i}.log") for i in range(count)]
    try:
        yield started
    finally:
        for _, process in started:
            stop(process)
