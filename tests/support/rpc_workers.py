"""llama.cpp's ``ggml-rpc-server``, built once per machine from the llama.cpp that the installed
llama-cpp-python's sdist vendors, and started as real worker processes on 127.0.0.1.

The same build has llama.cpp's shared libraries with the RPC backend: a llama-cpp-python that was
built without it (a cached wheel from before the quick start turned it on) is pointed at them with
``LLAMA_CPP_LIB_PATH``, llama-cpp-python's own override, so the client side is tested either way.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import serving
from tests.support.helpers import interruptible
from tests.support.llama_tools import built

SERVER = "ggml-rpc-server"


def build(cache: Path) -> Path:
    """The build's bin directory (``ggml-rpc-server`` and the shared libraries), once per machine."""
    return built(cache, "llama-rpc", ["-DGGML_RPC=ON"], [SERVER, "llama"])


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
