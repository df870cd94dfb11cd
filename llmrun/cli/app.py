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
        from llmrun.cli import render

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
    add_completion=False,
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


# command name -> (module in llmrun.cli, function); ``index`` is a group of its own
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "run"),
    "chat": ("chat", "chat"),
    "batch": ("batch", "batch"),
    "serve": ("serve", "serve"),
    "tokenize": ("inspect", "tokenize"),
    "next": ("inspect", "next_token"),
    "show": ("models", "show"),
    "pull": ("models", "pull"),
    "list": ("models", "list_models"),
    "rm": ("models", "rm"),
    "bench": ("bench", "bench"),
    "convert": ("convert", "convert"),
    "quantize": ("quantize", "quantize"),
    "eval": ("quantize", "evaluate"),
    "doctor": ("doctor", "doctor"),
}
GROUPS = {"index": "index"}


_registered: set[str] = set()


def build(only: str | None = None) -> typer.Typer:
    """The app with its commands: ``only`` that one (the command line names it: its module alone is
    imported, so ``llmrun run`` does not import the server, the quantizer, …), else all of them (help)."""
    import importlib

    for name, (module, function) in COMMANDS.items():
        if (only is None or only == name) and name not in _registered:
            app.command(name)(getattr(importlib.import_module(f"llmrun.cli.{module}"), function))
            _registered.add(name)
    for name, module in GROUPS.items():
        if (only is None or only == name) and name not in _registered:
            app.add_typer(importlib.import_module(f"llmrun.cli.{module}").app, name=name)
            _registered.add(name)
    return app


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
    build(command_named(sys.argv[1:]))()
