"""`llmrun doctor`'s diagnosis (pure) and the MLX directory reader (bounded)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from llmrun.doctor import CUDA_REBUILD, METAL_REBUILD, PACKAGES, Facts, diagnose
from llmrun.errors import ModelFileError
from llmrun.memory import geometry
from llmrun.mlx_header import read_mlx_header

GiB = 1024**3


def facts(**changes: object) -> Facts:
    base = Facts(
        system="Linux",
        machine="x86_64",
        python="3.11.9",
        versions=dict.fromkeys(PACKAGES, "1.0"),
        llama_gpu_offload=False,
        mlx_device="Device(cpu, 0)",
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


def _safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], declared: int | None = None) -> None:
    table, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = 2 * shape[0] * shape[1]
        table[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(table).encode()
    path.write_bytes(struct.pack("<Q", declared or len(head)) + head + b"\0" * offset)


def test_mlx_directory_reads_as_a_header(tmp_path: Path) -> None:
    config = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 18,
        "hidden_size": 640,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "max_position_embeddings": 32768,
        "sliding_window": 512,
        "vocab_size": 262144,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    _safetensors(tmp_path / "model.safetensors", {"a.weight": ("BF16", [4, 8]), "b.weight": ("F32", [2, 2])})
    header = read_mlx_header(tmp_path)
    assert header.architecture == "gemma3"
    assert header.chat_template == "{{ messages }}"
    assert header.weight_bytes == 2 * 4 * 8 + 2 * 2 * 2
    geom = geometry(header)
    assert geom is not None
    assert (geom.n_layers, geom.n_kv_heads, geom.head_dim_k, geom.n_vocab) == (18, 1, 256, 262144)
    assert geom.n_swa_layers == 15  # every sixth layer is global


def test_hostile_safetensors_header_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _safetensors(tmp_path / "model.safetensors", {"a": ("F16", [2, 2])}, declared=2**60)
    with pytest.raises(ModelFileError, match="declares a"):
        read_mlx_header(tmp_path)


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"no config\.json"):
        read_mlx_header(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="not valid"):
        read_mlx_header(tmp_path)
