"""What a process does before it first imports mlx, and the dtype a model computes in on the CPU.

mlx's Linux wheels (``mlx-cpu``) link the reference BLAS (netlib's: one core, about 7 GFLOP/s on a
2-core VM), and mlx multiplies bfloat16 with its own kernel at the same speed. An OpenBLAS the system
has (Debian: ``libopenblas0``), loaded first with its symbols global, takes mlx's ``cblas_sgemm`` calls:
float32 products about 30 times faster, a 257-token forward pass of Gemma 3 270M in 1 s instead of
22 s in bfloat16. So on the CPU, with such a BLAS, a model computes in float32 where the weights fit
in memory twice over; otherwise (macOS: Accelerate and the GPU; no OpenBLAS; a model too large) the
weights keep their dtype. ``LLMRUN_MLX_BLAS`` names the library, or ``none`` to leave mlx's own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from functools import cache

from llmrun.formats.mlx_header import quiet_transformers

BLAS_ENV = "LLMRUN_MLX_BLAS"


def prepare_mlx() -> str | None:
    """Call before the first ``import mlx``/``mlx_lm``: keeps transformers quiet and, on Linux, loads
    a fast BLAS for mlx if the system has one. The library loaded (its name), or None."""
    quiet_transformers()
    return _fast_blas()


@cache
def _fast_blas() -> str | None:
    if not sys.platform.startswith("linux") or "mlx.core" in sys.modules:
        return None  # too late once mlx is in: its symbols are bound
    wanted = os.environ.get(BLAS_ENV, "")
    if wanted.lower() == "none":
        return None
    name = wanted or ctypes.util.find_library("openblas")
    if not name:
        return None
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    return name


def fast_blas() -> str | None:
    """The BLAS mlx's float32 products go to in this process, if llmrun loaded one."""
    return _fast_blas() if "mlx.core" in sys.modules else None


def computes_in_float32(parameters: int, bytes_available: int, blas: str | None) -> bool:
    """Whether a model of ``parameters`` weights on the CPU computes in float32: with a fast BLAS, when
    the float32 weights (4 bytes each) take at most half the memory available."""
    return blas is not None and 4 * parameters <= bytes_available // 2
