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


def _register() -> None:
    from llmrun.cli import batch, bench, chat, convert, doctor, index, inspect, models, quantize, run, serve

    app.command("run")(run.run)
    app.command("chat")(chat.chat)
    app.command("batch")(batch.batch)
    app.command("serve")(serve.serve)
    app.command("tokenize")(inspect.tokenize)
    app.command("next")(inspect.next_token)
    app.command("show")(models.show)
    app.command("pull")(models.pull)
    app.command("list")(models.list_models)
    app.command("rm")(models.rm)
    app.command("bench")(bench.bench)
    app.command("convert")(convert.convert)
    app.command("quantize")(quantize.quantize)
    app.command("eval")(quantize.evaluate)
    app.command("doctor")(doctor.doctor)
    app.add_typer(index.app, name="index")


_register()


def main() -> None:
    app()
