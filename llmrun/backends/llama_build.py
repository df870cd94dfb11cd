"""What the installed llama.cpp was compiled for, against what this CPU has.

llama.cpp prints its compile-time CPU features (``llama_print_system_info``:
``CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | ...``). Two of them matter:

- ``AMX_INT8``: a build tuned to an AMX CPU (``-march=native`` on Sapphire Rapids or
  later) stores quantized weights in llama.cpp's AMX buffer type, and the AMX kernel
  (``ggml_backend_amx_mul_mat``) dies with a general protection fault on its first
  ``ldtilecfg``, because the compiler drops most of the tile configuration it builds
  on the stack (llama.cpp PR 26954, unmerged). llmrun then loads models without the
  extra buffer types (:func:`avoid_extra_buffers`), which also skips weight
  repacking; measured on an AVX-512 VM (benchmarks/bench_builds.py) that costs
  nothing: prefill and decode as fast as a build without AMX. ``LLMRUN_LLAMA_AMX=1``
  keeps them, for a llama.cpp that has the fix.
- features the build uses and the CPU lacks: an illegal-instruction crash.

:func:`parse_features` and :func:`host_features` are pure; :func:`build_features`
imports llama_cpp.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

AMX_ENV = "LLMRUN_LLAMA_AMX"
# The quick start's build: tuned to the host, without llama.cpp's AMX kernels, with its RPC backend.
BUILD_CMAKE = Path(__file__).resolve().parent.parent / "cmake" / "llama-cpp.cmake"
REBUILD = (
    f'CMAKE_ARGS="-DCMAKE_PROJECT_INCLUDE={BUILD_CMAKE}" pip install --force-reinstall --no-cache-dir llama-cpp-python'
)
# llama.cpp's feature names → the /proc/cpuinfo flag that runs them (x86 only; others are not checked)
_CPU_FLAGS = {
    "AVX": "avx",
    "AVX2": "avx2",
    "AVX_VNNI": "avx_vnni",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}
CPU_FEATURES = frozenset(_CPU_FLAGS)  # the instruction-set features among llama.cpp's (not LLAMAFILE, OPENMP, …)


def parse_features(system_info: str) -> frozenset[str]:
    """The CPU features a ``llama_print_system_info`` text reports as compiled in (``NAME = 1``)."""
    cpu = system_info.split("CPU :", 1)[1] if "CPU :" in system_info else system_info
    return frozenset(re.findall(r"([A-Z0-9_]+) = 1", cpu.split("\n", 1)[0]))


def host_features(cpuinfo: str) -> frozenset[str]:
    """llama.cpp's names for the features a Linux ``/proc/cpuinfo`` text lists in its first ``flags`` line."""
    match = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    flags = set(match.group(1).split()) if match else set()
    return frozenset(name for name, flag in _CPU_FLAGS.items() if flag in flags)


def read_host_features() -> frozenset[str] | None:
    """This CPU's features in llama.cpp's names; None where they cannot be read (not Linux x86)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return host_features(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return None


def build_features() -> frozenset[str]:
    import llama_cpp

    return parse_features(llama_cpp.llama_print_system_info().decode("utf-8", "replace"))


def amx_is_avoided(features: frozenset[str]) -> bool:
    return "AMX_INT8" in features and os.environ.get(AMX_ENV) != "1"


@contextlib.contextmanager
def avoid_extra_buffers() -> Iterator[None]:
    """Within this block, models that llama-cpp-python's ``Llama`` loads skip llama.cpp's extra
    buffer types (AMX and repacked weights) when the build has the crashing AMX kernels.

    ``Llama`` builds its model parameters from ``llama_model_default_params`` and loads at once,
    so the defaults are what can be changed; they are restored on leaving."""
    import llama_cpp.llama_cpp as native

    if not amx_is_avoided(build_features()):
        yield
        return
    original = native.llama_model_default_params

    def defaults() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    native.llama_model_default_params = defaults
    try:
        yield
    finally:
        native.llama_model_default_params = original
