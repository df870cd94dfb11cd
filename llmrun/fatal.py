"""The last word of a process that a native library is about to end.

Some failures inside llama.cpp cannot be returned to Python: its RPC client calls ``GGML_ABORT``
when a worker goes away mid-answer, and the process ends there. :func:`die` says one line
through the handler the adapter set (the CLI's error line), flushes what was already printed, and
ends the process itself, without the C backtrace and core dump of ``abort()``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from llmrun.errors import LlmrunError

Handler = Callable[[LlmrunError], None]
_handler: Handler | None = None


def set_handler(handler: Handler | None) -> None:
    """How :func:`die` shows its error (None: a plain ``error: …`` line on stderr)."""
    global _handler
    _handler = handler


def die(error: LlmrunError) -> NoReturn:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    try:
        if _handler is not None:
            _handler(error)
        else:
            hint = f" — {error.hint}" if error.hint else ""
            sys.stderr.write(f"error: {error.message}{hint}\n")
        sys.stderr.flush()
    finally:
        os._exit(error.exit_code)
