"""`llmrun doctor`'s diagnosis (pure) and the MLX directory reader (bounded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrun.backends import llama_build
from llmrun.engine.doctor import CUDA_REBUILD, METAL_REBUILD, PACKAGES, Facts, diagnose, report
from llmrun.errors import ModelFileError
from llmrun.formats.memory import geometry
from llmrun.formats.mlx_header import read_mlx_header
from tests.support.modelfiles import GEMMA3_CONFIG, safetensors

GiB = 1024**3


def facts(**changes: object) -> Facts:
    base = Facts(
        system="Linux",
        machine="x86_64",
        python="3.11.9",
        versions=dict.fromkeys(PACKAGES, "1.0"),
        llama_gpu_offload=False,
        mlx_device="Device(cpu, 0)",
        mlx_blas="libopenblas.so.0",
        memory_total=16 * GiB,
        memory_available=8 * GiB,
        disk_free=100 * GiB,
        paths={"user models.toml": "/cfg/models.toml"},
    )
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def test_a_healthy_linux_machine_has_no_problems() -> None:
    assert diagnose(facts()) == []


def test_mlx_on_a_linux_cpu_without_a_fast_blas_is_told_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [p.fix for p in diagnose(facts(mlx_blas=None))] == [
        "install OpenBLAS (Debian/Ubuntu: apt install libopenblas0): llmrun gives it to mlx"
    ]
    assert diagnose(facts(mlx_blas=None, mlx_device="Device(gpu, 0)")) == []
    monkeypatch.setenv("LLMRUN_MLX_BLAS", "none")  # the user's choice
    assert diagnose(facts(mlx_blas=None)) == []


def test_gpu_without_offload_gives_the_rebuild_command() -> None:
    assert [p.fix for p in diagnose(facts(nvidia_gpu=True))] == [CUDA_REBUILD]
    mac = facts(system="Darwin", machine="arm64", metal_available=True)
    assert METAL_REBUILD in [p.fix for p in diagnose(mac)]


def test_apple_silicon_without_mlx_lm() -> None:
    versions = {**dict.fromkeys(PACKAGES, "1.0"), "mlx-lm": None}
    problems = diagnose(facts(system="Darwin", machine="arm64", llama_gpu_offload=True, versions=versions))
    assert [p.fix for p in problems] == ["pip install 'llmrun[mlx]'"]


def test_low_disk_and_bad_registry() -> None:
    problems = diagnose(facts(disk_free=GiB // 2, registry_error="line 3: bad key"))
    fixes = " ".join(p.fix for p in problems)
    assert "LLMRUN_HOME" in fixes
    assert "/cfg/models.toml" in fixes


SAPPHIRE_RAPIDS_BUILD = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
    "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
PORTABLE_BUILD = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | REPACK = 1 | "
SAPPHIRE_RAPIDS_CPUINFO = (
    "processor\t: 0\nflags\t\t: fpu sse sse2 ssse3 fma sse4_1 avx f16c avx2 bmi2 avx512f avx512vbmi avx_vnni "
    "avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\nbugs\t\t: spectre_v1\n"
)


def test_build_and_host_features_in_llama_cpp_names() -> None:
    built = llama_build.parse_features(SAPPHIRE_RAPIDS_BUILD)
    assert {"AVX512", "AMX_INT8", "REPACK"} <= built and "AVX512_BF16" in built
    assert llama_build.parse_features("CPU : AVX2 = 0 | FMA = 1 |\nMetal : EMBED_LIBRARY = 1 |") == {"FMA"}
    host = llama_build.host_features(SAPPHIRE_RAPIDS_CPUINFO)
    assert host == built & llama_build.CPU_FEATURES
    assert llama_build.host_features("processor : 0\n") == frozenset()


def test_an_amx_build_is_avoided_and_using_its_kernels_is_a_problem() -> None:
    host = llama_build.host_features(SAPPHIRE_RAPIDS_CPUINFO)
    amx = facts(llama_cpu_features=llama_build.parse_features(SAPPHIRE_RAPIDS_BUILD), host_cpu_features=host)
    assert diagnose(amx) == []
    assert report(amx)["llama_cpp"]["amx"].startswith("compiled in, avoided")
    assert report(amx)["llama_cpp"]["cpu_features_unused"] == []
    opted_in = facts(llama_cpu_features=amx.llama_cpu_features, host_cpu_features=host, llama_amx_opt_in=True)
    [problem] = diagnose(opted_in)
    assert "LLMRUN_LLAMA_AMX=1" in problem.what and "segmentation fault" in problem.what
    assert "unset LLMRUN_LLAMA_AMX" in problem.fix and llama_build.REBUILD in problem.fix
    assert "llama-cpp.cmake" in llama_build.REBUILD and llama_build.BUILD_CMAKE.is_file()
    assert report(facts())["llama_cpp"]["amx"] == "not compiled in"


def test_a_portable_build_is_reported_not_a_problem_and_a_foreign_build_is() -> None:
    host = llama_build.host_features(SAPPHIRE_RAPIDS_CPUINFO)
    portable = facts(llama_cpu_features=llama_build.parse_features(PORTABLE_BUILD), host_cpu_features=host)
    assert diagnose(portable) == []
    unused = report(portable)["llama_cpp"]["cpu_features_unused"]
    assert "AVX512" in unused and "AMX_INT8" not in unused
    old_cpu = llama_build.host_features("flags : sse ssse3 avx\n")
    [problem] = diagnose(
        facts(llama_cpu_features=llama_build.parse_features(PORTABLE_BUILD), host_cpu_features=old_cpu)
    )
    assert "AVX2, BMI2, F16C, FMA" in problem.what and "illegal instruction" in problem.what


def test_the_amx_workaround_follows_the_build_and_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    amx = llama_build.parse_features(SAPPHIRE_RAPIDS_BUILD)
    monkeypatch.delenv(llama_build.AMX_ENV, raising=False)
    assert llama_build.amx_is_avoided(amx)
    assert not llama_build.amx_is_avoided(llama_build.parse_features(PORTABLE_BUILD))
    monkeypatch.setenv(llama_build.AMX_ENV, "1")
    assert not llama_build.amx_is_avoided(amx)


def test_quick_start_and_ci_build_llama_cpp_the_same_way() -> None:
    """Both quick-start lines and .ci/run build llama-cpp-python with the same CMAKE_ARGS."""
    import re

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```", 2)[1]
    lines = [line for line in block.splitlines()[1:] if line.strip()]
    quick = [re.search(r'CMAKE_ARGS="([^"]+)"', line) for line in lines]
    ci = re.search(r'CMAKE_ARGS="\$\{CMAKE_ARGS:-([^}]+)\}"', (root / ".ci" / "run").read_text())
    assert len(lines) == 2 and all(quick) and ci
    assert (
        {m.group(1) for m in quick if m}
        == {ci.group(1)}
        == {"-DCMAKE_PROJECT_INCLUDE=$PWD/llmrun/cmake/llama-cpp.cmake"}
    )
    # and both check what pip installed: a wheel from pip's cache ignores CMAKE_ARGS
    assert all("pip install -e" in line and "&& python scripts/ensure-llama-build.py &&" in line for line in lines)


def test_mlx_directory_reads_as_a_header(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3_CONFIG))
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    safetensors(tmp_path / "model.safetensors", {"a.weight": ("BF16", [4, 8]), "b.weight": ("F32", [2, 2])})
    header = read_mlx_header(tmp_path)
    assert header.architecture == "gemma3"
    assert header.chat_template == "{{ messages }}"
    assert header.weight_bytes == 2 * 4 * 8 + 2 * 2 * 2
    geom = geometry(header)
    assert geom is not None
    assert (geom.n_layers, geom.n_kv_heads, geom.head_dim_k, geom.n_vocab) == (18, 1, 256, 262144)
    assert geom.n_swa_layers == 15  # every sixth layer is global


def test_named_chat_templates_give_the_default_and_the_tool_use_one(tmp_path: Path) -> None:
    from llmrun.engine.request import Request, Templates
    from llmrun.prompt.template import Message
    from llmrun.structured.tools import Tool, ToolUse

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8}))
    named = [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "with {{ tools }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    header = read_mlx_header(tmp_path)
    assert (header.chat_template, header.tool_use_template) == ("plain", "with {{ tools }}")
    templates = Templates("plain", "plain", "the model's own", None, header.tool_use_template)
    chat = Request(messages=(Message("user", "hi"),))
    tools = ToolUse((Tool("add", "", "{}"),), "auto")
    assert templates.for_request(chat) == "plain"  # as transformers: tool_use only when tools are given
    assert templates.for_request(Request(messages=chat.messages, tools=tools)) == "with {{ tools }}"


def test_hostile_safetensors_header_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    safetensors(tmp_path / "model.safetensors", {"a": ("F16", [2, 2])}, declared=2**60)
    with pytest.raises(ModelFileError, match="declares a"):
        read_mlx_header(tmp_path)


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"no config\.json"):
        read_mlx_header(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="not valid"):
        read_mlx_header(tmp_path)


def test_float32_on_the_cpu_needs_a_fast_blas_and_room_for_the_weights() -> None:
    from llmrun.formats.mlx_runtime import computes_in_float32

    assert computes_in_float32(268_000_000, 8 * GiB, "libopenblas.so.0")
    assert not computes_in_float32(268_000_000, 8 * GiB, None)
    assert not computes_in_float32(1_100_000_000, 8 * GiB, "libopenblas.so.0")  # 4.4 GB > half of 8 GiB


@pytest.mark.parametrize("choice", ["", "none"])
def test_the_fast_blas_is_loaded_before_mlx_unless_the_user_says_none(choice: str) -> None:
    """In a fresh process (the library must come before mlx): OpenBLAS in the process's maps, or not."""
    import ctypes.util
    import os
    import subprocess
    import sys

    if ctypes.util.find_library("openblas") is None:
        pytest.skip("no OpenBLAS on this machine (Debian: apt install libopenblas0)")
    probe = (
        "from llmrun.formats.mlx_runtime import prepare_mlx, fast_blas\n"
        "name = prepare_mlx()\n"
        "import mlx.core\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(name, fast_blas(), 'libopenblas' in maps)\n"
    )
    env = {**os.environ, "LLMRUN_MLX_BLAS": choice}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    expected = "None None False" if choice == "none" else "libopenblas.so.0 libopenblas.so.0 True"
    assert done.stdout.split() == expected.split()


def test_the_quick_starts_build_check_names_what_a_cached_wheel_breaks() -> None:
    """scripts/ensure-llama-build.py: a wheel from pip's cache built without llmrun's include is rebuilt."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "ensure-llama-build.py"
    spec = importlib.util.spec_from_file_location("ensure_llama_build", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.missing(rpc=True, amx=False) == []  # the quick start's own build: nothing to do
    assert [m.split()[0:2] for m in script.missing(rpc=False, amx=True)] == [["has", "no"], ["has", "llama.cpp's"]]
    assert script.INCLUDE.is_file() and script.INCLUDE.name == "llama-cpp.cmake"


def test_what_only_slows_llmrun_is_a_warning_and_what_stops_it_an_error() -> None:
    warnings = diagnose(facts(mlx_blas=None, disk_free=GiB // 2, nvidia_gpu=True))
    assert warnings and {p.severity for p in warnings} == {"warning"}  # doctor exits 0
    errors = diagnose(facts(registry_error="line 3: bad key", llama_amx_opt_in=True, llama_cpu_features={"AMX_INT8"}))
    assert errors and {p.severity for p in errors} == {"error"}  # doctor exits 1
