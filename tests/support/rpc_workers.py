"""llama.cpp RPC workers, started as real worker processes on 127.0.0.1.

A llama-cpp-python built with the RPC backend (the quick start's build) carries
``ggml_backend_rpc_start_server`` in its own libggml-rpc: a worker is then a Python process that calls it
on the CPU device (what ``ggml-rpc-server`` does), and nothing is built. A llama-cpp-python built without
it gets llama.cpp's ``ggml-rpc-server``, built once per machine from the llama.cpp its sdist vendors, and
that build's shared libraries through ``LLAMA_CPP_LIB_PATH`` (llama-cpp-python's own override), so the
client side is tested either way.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import serving
from tests.support.helpers import interruptible
from tests.support.llama_tools import built

SERVER = "ggml-rpc-server"


# ggml-rpc-server's main, through llama-cpp-python's own libraries: the CPU device, one thread, no cache
WORKER = """
import ctypes, sys
import llama_cpp, llama_cpp.llama_cpp as native
llama_cpp.llama_backend_init()
lib = ctypes.CDLL(native._lib._name, handle=native._lib._handle)
lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
start = lib.ggml_backend_rpc_start_server
start.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
devices = (ctypes.c_void_p * 1)(lib.ggml_backend_dev_by_type(0))
print("worker listening on", sys.argv[1], flush=True)
start(sys.argv[1].encode(), None, 1, 1, devices)
"""


def build(cache: Path) -> Path | None:
    """None when llama-cpp-python's own libraries have the RPC backend (workers are Python processes);
    else the bin directory of a ``ggml-rpc-server`` build and its shared libraries, once per machine."""
    import llama_cpp

    if llama_cpp.llama_supports_rpc():
        return None
    return built(cache, "llama-rpc", ["-DGGML_RPC=ON"], [SERVER, "llama"])


def client_env(bin_dir: Path | None) -> dict[str, str]:
    """Environment for llmrun (and reference scripts): llama-cpp-python's own libraries when they have
    the RPC backend, else the ones built here."""
    return {} if bin_dir is None else {"LLAMA_CPP_LIB_PATH": str(bin_dir)}


def start(bin_dir: Path | None, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """One worker (one thread: the machine's cores go to whoever computes) listening on a free port."""
    port = serving.free_port()
    if bin_dir is None:
        command = [sys.executable, "-c", WORKER, f"127.0.0.1:{port}"]
    else:
        command = [str(bin_dir / SERVER), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=interruptible)
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
def running(bin_dir: Path | None, logs: Path, count: int) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    started = [start(bin_dir, logs / f"worker{i}.log") for i in range(count)]
    try:
        yield started
    finally:
        for _, process in started:
            stop(process)
