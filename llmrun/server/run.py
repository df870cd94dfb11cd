"""Running the app under uvicorn until SIGINT/SIGTERM (the CLI's `serve` calls :func:`run`)."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

import uvicorn

from llmrun.server.app import create_app
from llmrun.server.state import ServerState


def run(state: ServerState, host: str, port: int) -> None:
    """Serve until stopped; a stop asked for (Ctrl-C, SIGTERM) returns normally, and the models are unloaded."""
    config = uvicorn.Config(
        create_app(state), host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    # uvicorn handles SIGINT/SIGTERM itself, then raises the signal again once it has shut down:
    # a stop asked for is a clean exit, not an interruption
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        asyncio.run(_server(config, state).serve())
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        state.close()


class _Stop(Exception):
    pass


def _stopped(signum: int, frame: Any) -> None:
    raise _Stop


def _server(config: uvicorn.Config, state: ServerState) -> uvicorn.Server:
    """uvicorn's server, stopping the schedulers first on SIGINT/SIGTERM, so that streams in
    flight end with an error event instead of holding the shutdown."""

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # not in the signal handler itself: it may have interrupted this thread while it holds a lock
            if not state.closing:
                state.closing = True
                threading.Thread(target=state.close, name="llmrun shutdown", daemon=True).start()
            super().handle_exit(sig, frame)

    return Server(config)
