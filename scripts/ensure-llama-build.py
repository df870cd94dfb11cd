"""The quick start's llama.cpp build, whatever pip's cache held.

The quick start installs llama-cpp-python with ``CMAKE_ARGS=-DCMAKE_PROJECT_INCLUDE=llmrun/cmake/llama-cpp.cmake``
(llama.cpp's RPC backend on, its AMX kernels off). When pip's wheel cache already holds a llama-cpp-python
wheel of that version — built before, by anyone, with any flags — pip installs that wheel and the flags do
nothing. This checks the installed build for what the include asks and, when it lacks it, rebuilds that one
package from source with the include (``--no-cache-dir``: the cached wheel is not used again). One line says
what it does; a failed build is one line naming what to install. Exit 0: the build is the quick start's.

Usage: python scripts/ensure-llama-build.py   (the quick start's lines run it after pip install)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

INCLUDE = Path(__file__).resolve().parents[1] / "llmrun" / "cmake" / "llama-cpp.cmake"
PROBE = (
    "import llama_cpp, sys; "
    "info = llama_cpp.llama_print_system_info().decode('utf-8', 'replace'); "
    "print(llama_cpp.__version__, int(bool(llama_cpp.llama_supports_rpc())), int(' AMX_INT8 = 1' in info))"
)


def probe() -> tuple[str, bool, bool] | None:
    """(version, has the RPC backend, has the AMX kernels) of the installed build, in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    version, rpc, amx = done.stdout.split()
    return version, rpc == "1", amx == "1"


def missing(rpc: bool, amx: bool) -> list[str]:
    """How the installed build breaks the include's promise."""
    return [
        *([] if rpc else ["has no RPC backend (--rpc)"]),
        *(["has llama.cpp's AMX kernels (which crash in this version)"] if amx else []),
    ]


def cmake_args() -> str:
    """The user's own CMAKE_ARGS (a CUDA or Metal build, say), with the include added unless they name one."""
    given = os.environ.get("CMAKE_ARGS", "")
    if "CMAKE_PROJECT_INCLUDE" in given:
        return given
    return f"{given} -DCMAKE_PROJECT_INCLUDE={INCLUDE}".strip()


def rebuild(version: str) -> int:
    if shutil.which("cc") is None and shutil.which("gcc") is None and shutil.which("clang") is None:
        print("llmrun: no C compiler to build llama-cpp-python: install one (apt-get install build-essential cmake)")
        return 1
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps", "--no-cache-dir"]
    command.append(f"llama-cpp-python=={version}")
    done = subprocess.run(command, env={**os.environ, "CMAKE_ARGS": cmake_args()})
    if done.returncode != 0:
        print(f"llmrun: pip could not build llama-cpp-python {version} (its output above says why)", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    found = probe()
    if found is None:
        print("llmrun: llama-cpp-python is not installed or does not import: run the quick start's pip install first")
        return 1
    version, rpc, amx = found
    lacking = missing(rpc, amx)
    if not lacking:
        return 0
    print(
        f"llmrun: the llama-cpp-python {version} pip installed (a wheel from its cache, built otherwise) "
        f"{' and '.join(lacking)}: rebuilding it from source with llmrun/cmake/llama-cpp.cmake (about 8 minutes "
        "on two cores)",
        file=sys.stderr,
    )
    if rebuild(version) != 0:
        return 1
    again = probe()
    if again is None or missing(again[1], again[2]):
        print(f"llmrun: the rebuilt llama-cpp-python still {' and '.join(lacking)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if not re.fullmatch(r"3\.(1[1-9]|[2-9]\d)", f"{sys.version_info.major}.{sys.version_info.minor}"):
        sys.exit(f"llmrun needs Python 3.11 or later; this is {sys.version.split()[0]}")
    sys.exit(main())
