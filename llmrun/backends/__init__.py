"""Backends by name, imported lazily (loading one imports its heavy library)."""

from __future__ import annotations

from importlib import import_module
from typing import cast

from llmrun.backends.base import Backend
from llmrun.errors import BackendError, UsageError

_BACKENDS = {"gguf": ("llmrun.backends.gguf", "GgufBackend"), "mlx": ("llmrun.backends.mlx", "MlxBackend")}


def names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def get(name: str) -> Backend:
    try:
        module_name, class_name = _BACKENDS[name]
    except KeyError:
        raise UsageError(f"unknown backend {name!r}", f"choose one of: {', '.join(_BACKENDS)}") from None
    backend_class = getattr(import_module(module_name), class_name)
    return cast(Backend, backend_class())


def mlx_missing() -> BackendError:
    return BackendError("the MLX backend needs mlx-lm, which is not installed", "pip install 'llmrun[mlx]'")
