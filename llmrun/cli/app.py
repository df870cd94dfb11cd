"""The Typer app and the one error table.

Every :class:`LlmrunError` becomes one line on stderr (what is wrong — what to do)
and its exit code; Ctrl-C exits 130; any other exception is a bug, shown as one
line unless ``--debug`` (or ``LLMRUN_DEBUG=1``) asks for the traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

from llmrun import __version__
from llmrun.errors import LlmrunError

EXIT_INTERRUPTED = 130


def _debug(ctx: typer.Context) -> bool:
    env = os.environ.get("LLMRUN_DEBUG", "").lower() in ("1", "true", "yes")
    return env or bool((ctx.obj or {}).get("debug"))


class LlmrunGroup(TyperGroup):
    """Maps errors raised by any command to the error table."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]  # typer.Context subclasses it
        from llmrun import fatal
        from llmrun.cli import render

        fatal.set_handler(lambda exc: render.error(exc.message, exc.hint))  # a native library's last word
        try:
            return super().invoke(ctx)
        except LlmrunError as exc:
            if _debug(ctx):
                raise
            render.error(exc.message, exc.hint)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            render.note("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            # the reader went away (`llmrun run ... | head`): stop quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(0) from None
        except TyperException as exc:
            # click-level usage errors (a value of the wrong type, an unknown option): one line too
            usage = getattr(exc, "ctx", None)
            command = usage.command_path if usage is not None else "llmrun"
            render.error(exc.format_message(), f"see '{command} --help'")
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            if _debug(ctx):
                raise
            render.error(
                f"internal error: {type(exc).__name__}: {exc}",
                "rerun with --debug for the traceback, and please report it",
            )
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=LlmrunGroup,
    name="llmrun",
    help="Run quantized LLMs locally, and see how they work.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=True,  # --install-completion / --show-completion: bash, zsh, fish, PowerShell
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llmrun {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors (also LLMRUN_DEBUG=1).")] = False,
    offline: Annotated[
        bool, typer.Option("--offline", help="Never contact the Hub; use what is downloaded (also HF_HUB_OFFLINE=1).")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    ctx.obj = {"debug": debug}
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub is imported, which reads it once
    if _debug(ctx):
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")


# command name -> (module in llmrun.cli, function, the line the root --help lists it with)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("run", "run", "Run one prompt and stream the answer."),
    "chat": ("chat", "chat", "Chat with a model."),
    "batch": (
        "batch",
        "batch",
        "Generate answers for many prompts with continuous batching; results as JSONL in input order.",
    ),
    "serve": (
        "serve",
        "serve",
        "Serve the OpenAI API (/v1: chat, responses, completions, embeddings), Anthropic's and Ollama's (/api).",
    ),
    "launch": (
        "launch",
        "launch",
        "Run a coding agent (Claude Code, Codex CLI) on a local model: llmrun serves it, the agent talks to it.",
    ),
    "ps": ("running", "ps", "What a running server holds: each model loaded, its memory, context, slots, until when."),
    "stop": ("running", "stop", "Unload a model from a running server."),
    "tokenize": ("inspect", "tokenize", "Show how a model splits text into tokens: ids, pieces, counts."),
    "next": (
        "inspect",
        "next_token",
        "One forward pass: the most likely next tokens, and what temperature, top-k, top-p and min-p do to them.",
    ),
    "look": (
        "look",
        "look",
        "One forward pass, looked into: tokens as vectors, attention, and the prediction forming layer by layer.",
    ),
    "show": ("models", "show", "Architecture, size, tensor types, chat template, licence, and a memory plan."),
    "pull": ("models", "pull", "Download a model from the Hugging Face Hub into the local store, verified by sha256."),
    "list": ("models", "list_models", "The models in the local store: name, quant, size, when pulled, where."),
    "rm": ("models", "rm", "Remove a pulled model and its files (only files no other model uses)."),
    "bench": (
        "bench",
        "bench",
        "Measure prompt processing (pp) and generation (tg) speed, time to first token and memory.",
    ),
    "convert": ("convert", "convert", "Convert a GGUF into an MLX model directory, or into an unquantized GGUF."),
    "quantize": (
        "quantize",
        "quantize",
        "Quantize a model to 4 or 8 bits, register it, and report what it cost in quality against the source.",
    ),
    "eval": ("quantize", "evaluate", "Measure a model against a reference on a fixed text: perplexity, KL, top-1."),
    "doctor": (
        "doctor",
        "doctor",
        "Check this machine: platform, Python, llama.cpp and MLX builds, GPU offload, memory, disk, paths.",
    ),
}
GROUPS = {
    "index": ("index", "Index local documents for answers grounded in them (llmrun run --rag NAME)."),
    "cache": ("cache", "The KV store: prompt prefixes kept on disk so later runs skip their prefill (ls, rm, clear)."),
}
_registered: set[str] = set()


def build(only: str | None = None) -> typer.Typer:
    """The app with its commands: ``only`` that one (the command line names it: its module alone is
    imported, so ``llmrun run`` does not import the server, the quantizer, …), else all of them."""
    import importlib

    for name, (module, function, summary) in COMMANDS.items():
        if (only is None or only == name) and name not in _registered:
            command = getattr(importlib.import_module(f"llmrun.cli.{module}"), function)
            app.command(name, short_help=summary)(command)
            _registered.add(name)
    for name, (module, summary) in GROUPS.items():
        if (only is None or only == name) and name not in _registered:
            app.add_typer(importlib.import_module(f"llmrun.cli.{module}").app, name=name, short_help=summary)
            _registered.add(name)
    return app


def listing() -> typer.Typer:
    """The app as the root's help shows it: every command by name and summary, none of their modules
    imported (``llmrun --help`` costs what a two-command Typer app's does). Only help is shown from it;
    a command line that names a command gets :func:`build`'s real one."""
    summaries = {name: summary for name, (*_, summary) in COMMANDS.items()}
    summaries |= {name: summary for name, (_, summary) in GROUPS.items()}
    for name, summary in summaries.items():
        if name not in _registered:
            app.command(name, short_help=summary, help=summary)(_not_loaded)
            _registered.add(name)
    return app


def _not_loaded() -> None:
    raise LlmrunError("this command was not loaded", "run it as `llmrun COMMAND …`")


def command_named(argv: list[str]) -> str | None:
    """The command an argument list runs (the first word that is not an option of the root), if it is one."""
    for word in argv:
        if word.startswith("-"):
            if word in ("-h", "--help", "--version"):
                return None
            continue
        return word if word in COMMANDS or word in GROUPS else None
    return None


def main() -> None:
    if sys.argv[1:2] in (["--show-completion"], ["--install-completion"]):
        from llmrun.cli.complete import answer_shell_request, shell_request

        asked = shell_request(sys.argv[1:])
        if asked is not None:
            sys.exit(answer_shell_request(*asked))
    command = command_named(_completing() or sys.argv[1:])
    (build(command) if command is not None else listing())()


def _completing() -> list[str]:
    """The words a shell asks completions for (Typer's scripts pass them in the environment, not argv)."""
    if "_LLMRUN_COMPLETE" not in os.environ:
        return []
    words = os.environ.get("_TYPER_COMPLETE_ARGS") or os.environ.get("COMP_WORDS", "")
    return words.split()[1:]
