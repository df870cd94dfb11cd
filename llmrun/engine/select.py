"""Which backend runs a model: ``--backend auto|gguf|mlx`` (pure given the facts).

auto: an MLX directory runs on MLX and a GGUF file on llama.cpp. A registry
model runs on MLX only on Apple silicon with mlx-lm installed and an MLX source
listed; elsewhere on llama.cpp, because MLX on Linux runs on the CPU only and is
about 12× slower there. A model that exists only as MLX runs on MLX anywhere.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmrun.backends import mlx_missing
from llmrun.errors import UsageError
from llmrun.models.refs import ModelRef
from llmrun.models.registry import Registry

BACKEND_CHOICES = ("auto", "gguf", "mlx")
Format = Literal["gguf", "mlx"]


@dataclass(frozen=True, slots=True)
class ModelForms:
    """What a model name offers: a local format, or registry sources."""

    local: Format | None  # a path: what it is
    gguf: bool  # a GGUF source (file, embedded package or repo)
    mlx: bool  # an MLX source (directory or repo)


@dataclass(frozen=True, slots=True)
class Platform:
    apple_silicon: bool
    mlx_installed: bool


@dataclass(frozen=True, slots=True)
class Choice:
    backend: Format
    reason: str


def this_platform() -> Platform:
    apple = sys.platform == "darwin" and platform.machine() == "arm64"
    return Platform(apple, importlib.util.find_spec("mlx_lm") is not None)


def forms(ref: ModelRef, registry: Registry, made_here: Format | None = None) -> ModelForms:
    """``made_here``: the format of a model of this name made on this machine (llmrun quantize)."""
    if made_here is not None:
        return ModelForms(made_here, made_here == "gguf", made_here == "mlx")
    if ref.kind == "path":
        path = Path(ref.name).expanduser()
        local: Format | None = "mlx" if path.is_dir() else "gguf"
        return ModelForms(local, local == "gguf", local == "mlx")
    if ref.kind in ("ollama", "lmstudio"):  # other tools' stores hold GGUF files
        return ModelForms("gguf", True, False)
    if ref.kind == "hub":  # an MLX repo says so in its name (mlx-community/…, …-mlx)
        mlx = ref.file is None and "mlx" in ref.name.lower()
        return ModelForms(None, not mlx, mlx)
    entry = registry.get(ref.name) or registry.get(ref.name.rpartition("-")[0])
    if entry is None:
        return ModelForms(None, True, False)  # resolve() reports the unknown name
    return ModelForms(None, bool(entry.embedded or entry.package or entry.gguf), bool(entry.mlx))


def check_requested(requested: str) -> None:
    if requested not in BACKEND_CHOICES:
        raise UsageError(f"`backend` must be one of {', '.join(BACKEND_CHOICES)}, got {requested!r}")


def choose(requested: str, name: str, model: ModelForms, here: Platform) -> Choice:
    check_requested(requested)
    if requested == "gguf":
        if not model.gguf:
            hint = "use `backend` mlx (or auto)" if model.mlx else "check the name"
            raise UsageError(f"{name} has no GGUF form for the gguf backend", hint)
        return Choice("gguf", "requested")
    if requested == "mlx":
        if not model.mlx:
            raise UsageError(
                f"{name} has no MLX form for the mlx backend",
                f"convert it first: llmrun convert {name} --to mlx -o DIR, then run -m DIR"
                if model.gguf
                else "check the name",
            )
        _need_mlx(here)
        return Choice("mlx", "requested")
    if model.local == "mlx":
        _need_mlx(here)
        return Choice("mlx", "auto: the model is an MLX directory")
    if model.local == "gguf":
        return Choice("gguf", "auto: the model is a GGUF file")
    if model.mlx and here.apple_silicon and here.mlx_installed:
        return Choice("mlx", "auto: Apple silicon, and the model has an MLX source")
    if model.gguf:
        why = (
            "not Apple silicon (MLX would run on the CPU only)"
            if not here.apple_silicon
            else "mlx-lm is not installed"
            if not here.mlx_installed
            else "the model has no MLX source"
        )
        return Choice("gguf", f"auto: {why}")
    _need_mlx(here)
    return Choice("mlx", "auto: the model exists only as MLX")


def choose_for(requested: str, name: str, ref: ModelRef, registry: Registry, here: Platform | None = None) -> Choice:
    """:func:`choose` for a parsed name, on this machine unless ``here`` says otherwise."""
    from llmrun.models import pull

    made = pull.made_here_as(ref, registry)
    made_format: Format | None = "mlx" if made and made[1] == "mlx" else "gguf" if made else None
    return choose(requested, name, forms(ref, registry, made_format), here or this_platform())


def _need_mlx(here: Platform) -> None:
    if not here.mlx_installed:
        raise mlx_missing()
