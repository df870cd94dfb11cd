"""Shell completion (``llmrun --install-completion``): what an option or argument can be.

Typer calls these only when the shell asks for completions, so nothing here is imported on the
way to an ordinary command beyond this small module. A completion never prints an error into the
shell: a registry or store that cannot be read completes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llmrun.errors import LlmrunError


def model_names(incomplete: str) -> list[str]:
    """Names from models.toml and the local store (pulled models) that begin with ``incomplete``."""

    def names() -> Iterable[str]:
        from llmrun.models.registry import load_registry

        return sorted({*load_registry().models, *_pulled()})

    return _starting(names, incomplete)


def pulled_names(incomplete: str) -> list[str]:
    """Names of pulled models (what ``llmrun rm`` removes)."""
    return _starting(lambda: sorted(_pulled()), incomplete)


def backend_names(incomplete: str) -> list[str]:
    """What ``--backend`` takes."""
    from llmrun.engine.select import BACKEND_CHOICES

    return _starting(lambda: BACKEND_CHOICES, incomplete)


def choices(*values: str) -> Callable[[str], list[str]]:
    """A completion for an option that takes one of ``values``."""
    return lambda incomplete: _starting(lambda: values, incomplete)


def _pulled() -> Iterable[str]:
    from llmrun.models.store import read_index

    return read_index()


def _starting(names: Callable[[], Iterable[str]], incomplete: str) -> list[str]:
    """The names that begin with ``incomplete``, in their order; none when they cannot be read."""
    try:
        found = list(names())
    except (LlmrunError, OSError, ValueError):
        return []
    return [name for name in found if name.startswith(incomplete)]
