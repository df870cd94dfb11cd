"""Shell completion: Typer's scripts, in a real bash where there is one, and its protocol for zsh and fish.

Completion runs the installed ``llmrun`` entry point as the shell would, with the hermetic LLMRUN_HOME
and configuration directory the suite gives every test (a models.toml entry of the test's own shows up).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent  # where pip put the llmrun entry point


def env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def llmrun(args: list[str]) -> subprocess.CompletedProcess[str]:
    """The entry point a shell runs (its program name is what the scripts complete)."""
    return subprocess.run([str(BIN / "llmrun"), *args], env=env(), capture_output=True, text=True, timeout=60)


def protocol(shell: str, words: str) -> list[str]:
    """What ``llmrun`` answers a shell that asks for completions of ``words`` (Typer's protocol)."""
    extra = {"_LLMRUN_COMPLETE": f"complete_{shell}", "_TYPER_COMPLETE_ARGS": words}
    if shell == "bash":
        extra |= {"COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    if shell == "fish":
        extra["_TYPER_COMPLETE_FISH_ACTION"] = "get-args"
    done = subprocess.run(
        [str(BIN / "llmrun")], env={**env(), **extra}, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout.split()


@pytest.fixture(autouse=True)
def my_model() -> None:
    config = Path(os.environ["LLMRUN_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / "models.toml").write_text('[models."mine:7b"]\nendpoint = "http://127.0.0.1:9/v1"\n')


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
def test_bash_completes_commands_options_and_model_names() -> None:
    script = llmrun(["--show-completion", "bash"])
    assert script.returncode == 0 and "complete -o default -F _llmrun_completion llmrun" in script.stdout

    def complete(*words: str) -> list[str]:
        line = " ".join(f'"{w}"' for w in words)
        program = (
            f"{script.stdout}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
            '_llmrun_completion llmrun; printf "%s\\n" "${COMPREPLY[@]}"'
        )
        done = subprocess.run(["bash", "-c", program], env=env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("llmrun", "ch") == ["chat"]
    assert {"run", "serve", "look"} <= set(complete("llmrun", ""))
    assert complete("llmrun", "run", "-m", "gem") == ["gemma3:1b", "gemma3:270m"]
    assert complete("llmrun", "chat", "--model", "min") == ["mine:7b"]  # the user's models.toml
    assert complete("llmrun", "run", "--flash-attn", "o") == ["on", "off"]
    assert "--show-special" in complete("llmrun", "run", "--show-s")
    assert complete("llmrun", "show", "smollm2:1") == ["smollm2:135m"]
    assert complete("llmrun", "rm", "") == []  # nothing pulled into this test's store


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_get_the_same_names(shell: str) -> None:
    answer = " ".join(protocol(shell, "llmrun run -m gem"))
    assert "gemma3" in answer and "270m" in answer and "1b" in answer
    script = llmrun(["--show-completion", shell])  # the shell named, whichever shell runs the test
    own = {"zsh": "#compdef llmrun", "fish": "complete --command llmrun"}[shell]
    assert script.returncode == 0 and script.stdout.startswith(own) and "_LLMRUN_COMPLETE" in script.stdout


def test_a_shell_without_completion_is_one_line() -> None:
    done = llmrun(["--show-completion", "tcsh"])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: no completion for the shell 'tcsh' — name one: llmrun --show-completion bash (or zsh, fish, powershell)"
    ]


def test_completion_costs_an_ordinary_run_nothing_it_did_not_cost() -> None:
    # the root's --help lists the commands without importing their modules, completion included
    done = llmrun(["--help"])
    assert done.returncode == 0 and "--install-completion" in done.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, llmrun.cli.options; print('llmrun.models.registry' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.stdout.strip() == "False"  # the completers import the registry only when asked
