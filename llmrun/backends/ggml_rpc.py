"""llama.cpp's RPC backend, reached through ctypes, and the devices ggml knows.

llama-cpp-python 0.3.x dropped ``rpc_servers`` from ``Llama()``. llama.cpp's own tools add workers
the way :func:`register` does: ``ggml_backend_reg_by_name("RPC")``, its
``ggml_backend_rpc_add_server`` (found with ``ggml_backend_reg_get_proc_address``), then
``ggml_backend_register`` of the registry it returns. A model loaded afterwards with layers to offload
puts them on the workers (llama.cpp splits the layers by the workers' free memory).

Needs a llama-cpp-python built with ``-DGGML_RPC=ON`` (the quick start's build is; see
:data:`REBUILD`). The functions are looked up through llama-cpp-python's own library handle
(``LLAMA_CPP_LIB_PATH`` is honoured the same way), so the devices registered here are the ones its
``Llama`` sees.
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
from collections.abc import Sequence
from typing import Any

from llmrun import fatal
from llmrun.backends import llama_build
from llmrun.errors import BackendError

REBUILD = llama_build.REBUILD  # the quick start's build has the RPC backend
DEVICE_TYPE_GPU = 1  # enum ggml_backend_dev_type: CPU, GPU, IGPU, ACCEL
DEVICE_TYPE_IGPU = 2

_lock = threading.Lock()
_registered: set[str] = set()  # workers this process has added (ggml keeps one connection to each)
_abort_callback: Any = None  # kept referenced: ggml holds a raw pointer to it


@functools.cache
def _ggml() -> ctypes.CDLL:
    """ggml's functions, looked up through llama-cpp-python's libllama handle.

    A symbol lookup through a library's handle searches its dependencies too, so these are the
    functions of the very ggml that libllama uses. Opening ``libggml.so`` by its path is not: a wheel
    cannot hold symbolic links, so ``libggml.so`` and the ``libggml.so.0`` that libllama loaded are two
    copies of one file, and the dynamic loader would give a second ggml with a registry of its own."""
    import llama_cpp.llama_cpp as native

    lib = ctypes.CDLL(native._lib._name, handle=native._lib._handle)
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    return lib


def _load_backends() -> bool:
    """llama.cpp's own first step (``llama_supports_gpu_offload`` loads a dynamic-backend build's
    backends when none is registered yet); whether it found anything to offload to, RPC included."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    return bool(llama_cpp.llama_supports_gpu_offload())


def available() -> bool:
    """Whether this llama.cpp build has the RPC backend (a dynamic-backend build's are loaded first)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_rpc())


def has_gpu() -> bool:
    """Whether ggml has a GPU (or integrated GPU) device here, workers aside: llama.cpp's own
    ``llama_supports_gpu_offload`` answers yes for any build with the RPC backend."""
    if not _load_backends():
        return False
    lib = _ggml()
    return bool(lib.ggml_backend_dev_by_type(DEVICE_TYPE_GPU) or lib.ggml_backend_dev_by_type(DEVICE_TYPE_IGPU))


def _on_abort(message: bytes | None) -> None:
    text = (message or b"").decode("utf-8", "replace").strip()
    text = re.sub(r"^\S*/([\w.-]+:\d+): ", r"\1: ", text)  # the source file without the build's path
    fatal.die(
        BackendError(
            f"an RPC worker went away or answered wrongly, and llama.cpp stopped ({text or 'GGML_ABORT'})",
            "check the workers (ggml-rpc-server) and run again",
        )
    )


def _catch_aborts() -> None:
    """Route ggml's fatal errors through :func:`llmrun.fatal.die` (one line instead of a backtrace)."""
    global _abort_callback
    if _abort_callback is not None:
        return
    lib = _ggml()
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    lib.ggml_set_abort_callback.argtypes = [callback_type]
    lib.ggml_set_abort_callback.restype = ctypes.c_void_p
    _abort_callback = callback_type(_on_abort)
    lib.ggml_set_abort_callback(_abort_callback)


def register(endpoints: Sequence[str]) -> None:
    """Add the workers at ``endpoints`` (HOST:PORT, already probed: llama.cpp ends the process on one
    it cannot reach) as ggml devices; the ones this process already added are skipped."""
    if not available():
        raise BackendError("this llama-cpp-python was built without llama.cpp's RPC backend", f"rebuild it: {REBUILD}")
    with _lock:
        _catch_aborts()
        ggml = _ggml()
        reg = ggml.ggml_backend_reg_by_name(b"RPC")
        address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
        if not address:
            raise BackendError("llama.cpp's RPC backend has no ggml_backend_rpc_add_server", f"rebuild: {REBUILD}")
        add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
        for endpoint in endpoints:
            if endpoint in _registered:
                continue
            worker_reg = add_server(endpoint.encode())
            if not worker_reg:
                raise BackendError(f"the RPC worker at {endpoint} offers no device", "start it with a device")
            ggml.ggml_backend_register(worker_reg)
            _registered.add(endpoint)
