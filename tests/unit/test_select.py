"""Backend choice (pure): auto, explicit choices, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmrun.engine.select import Choice, ModelForms, Platform, choose, forms
from llmrun.errors import BackendError, UsageError
from llmrun.models.refs import ModelRef
from llmrun.models.registry import ModelEntry, Registry

MAC = Platform(apple_silicon=True, mlx_installed=True)
MAC_NO_MLX = Platform(apple_silicon=True, mlx_installed=False)
LINUX = Platform(apple_silicon=False, mlx_installed=True)
BOTH = ModelForms(None, gguf=True, mlx=True)
GGUF_ONLY = ModelForms(None, gguf=True, mlx=False)
MLX_ONLY = ModelForms(None, gguf=False, mlx=True)


@pytest.mark.parametrize(
    ("model", "here", "backend", "reason_part"),
    [
        (BOTH, MAC, "mlx", "Apple silicon"),
        (BOTH, LINUX, "gguf", "not Apple silicon"),
        (BOTH, MAC_NO_MLX, "gguf", "mlx-lm is not installed"),
        (GGUF_ONLY, MAC, "gguf", "no MLX source"),
        (MLX_ONLY, LINUX, "mlx", "only as MLX"),
        (ModelForms("mlx", False, True), LINUX, "mlx", "MLX directory"),
        (ModelForms("gguf", True, False), MAC, "gguf", "GGUF file"),
    ],
)
def test_auto(model: ModelForms, here: Platform, backend: str, reason_part: str) -> None:
    choice = choose("auto", "m", model, here)
    assert choice.backend == backend
    assert reason_part in choice.reason


def test_explicit_choices_win() -> None:
    assert choose("gguf", "m", BOTH, MAC) == Choice("gguf", "requested")
    assert choose("mlx", "m", BOTH, LINUX) == Choice("mlx", "requested")


def test_mlx_for_a_gguf_names_the_convert_command() -> None:
    with pytest.raises(UsageError) as caught:
        choose("mlx", "model.gguf", ModelForms("gguf", True, False), LINUX)
    assert "llmrun convert model.gguf --to mlx" in caught.value.hint


def test_gguf_for_an_mlx_directory_is_refused() -> None:
    with pytest.raises(UsageError, match="no GGUF form"):
        choose("gguf", "dir", ModelForms("mlx", False, True), LINUX)


def test_mlx_without_mlx_lm_says_how_to_install() -> None:
    with pytest.raises(BackendError) as caught:
        choose("mlx", "m", BOTH, MAC_NO_MLX)
    assert "llmrun[mlx]" in caught.value.hint


def test_unknown_backend() -> None:
    with pytest.raises(UsageError, match="`backend` must be one of auto, gguf, mlx"):
        choose("cuda", "m", BOTH, LINUX)


def test_forms(tmp_path: Path) -> None:
    registry = Registry(
        "a",
        {
            "a": ModelEntry("a", gguf=None, embedded="pkg"),
            "b": ModelEntry("b", mlx={"4": "mlx-community/b-4bit"}),
        },
        (),
    )
    assert forms(ModelRef.parse("a"), registry) == ModelForms(None, True, False)
    assert forms(ModelRef.parse("b"), registry) == ModelForms(None, False, True)
    assert forms(ModelRef.parse("mlx-community/Qwen-4bit"), registry) == ModelForms(None, False, True)
    assert forms(ModelRef.parse("bartowski/Qwen-GGUF"), registry) == ModelForms(None, True, False)
    assert forms(ModelRef.parse(str(tmp_path)), registry).local == "mlx"
