"""Shell completion (``llmrun --install-completion``): what an option or argument can be.

Typer calls these only when the shell asks for completions, so nothing here is imported on the
way to an ordinary command beyond this small module. A completion never prints an error into the
shell: a registry or store that cannot be read completes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from llmrun.errors import LlmrunError


def model_names(incomplete: str) -> list[str]:
    """Names from models.toml and the local store (pulled models) that begin with ``incomplete``."""
    try:
        from llmrun.models.registry import load_registry
        from llmrun.models.store import read_index

        names = set(load_registry().models) | set(read_index())
    except (LlmrunError, OSError, ValueError):
        return []
    return sorted(name for name in names if name.startswith(incomplete))


def pulled_names(incomplete: str) -> list[str]:
    """Names of pulled models (what ``llmrun rm`` removes)."""
    try:
        from llmrun.models.store import read_index

        names = set(read_index())
    except (LlmrunError, OSError, ValueError):
        return []
    return sorted(name for name in names if name.startswith(incomplete))


def choices(*values: str) -> Callable[[str], list[str]]:
    """A completion for an option that takes one of ``values``."""

    def complete(incomplete: str) -> list[str]:
        return [value for value in values if value.startswith(incomplete)]

    return complete
