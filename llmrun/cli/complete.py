"""Shell completion (``llmrun --install-completion``): what an option or argument can be.

Typer calls these only when the shell asks for completions, so nothing here is imported on the
way to an ordinary command beyond this small module. A completion never prints an error into the
shell: a registry or store that cannot be read completes nothing.
"""

from __future__ import annotations

import os
import sys
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


SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
SHELL_FLAGS = ("--show-completion", "--install-completion")


def shell_request(argv: list[str]) -> tuple[str, str | None] | None:
    """``--show-completion [SHELL]`` or ``--install-completion [SHELL]`` as the only words: the flag and
    the shell named, if one is. (Typer's own options take no value: they detect the shell from the
    parent processes and would ignore a name, printing bash's script to ``--show-completion fish``.)"""
    if 1 <= len(argv) <= 2 and argv[0] in SHELL_FLAGS:
        return argv[0], argv[1] if len(argv) == 2 else None
    return None


def answer_shell_request(flag: str, named: str | None) -> int:
    """Print or install the completion script for the shell named (else the one detected); the exit code."""
    from typer._completion_shared import _get_shell_name, get_completion_script, install

    from llmrun.cli import render

    shell = named if named is not None else _get_shell_name()
    if shell not in SHELLS:
        what = f"no completion for the shell '{shell}'" if shell else "could not tell which shell this is"
        render.error(what, f"name one: llmrun {flag} bash (or zsh, fish, powershell)")
        return 2
    names = {"prog_name": "llmrun", "complete_var": "_LLMRUN_COMPLETE", "shell": shell}
    if flag == "--show-completion":
        try:
            print(get_completion_script(**names), flush=True)
        except BrokenPipeError:  # `llmrun --show-completion | head`: the reader went away
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    shell, path = install(**names)
    print(f"{shell} completion installed in {path}; it takes effect in a new terminal")
    return 0
