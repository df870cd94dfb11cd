"""Running the app under uvicorn until SIGINT/SIGTERM (the CLI's `serve` calls :func:`run`)."""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from llmrun.server.app import create_app
from llmrun.server.state import ServerState

HEADER_TIMEOUT_S = 10.0  # a request's headers arrive whole within this, or the connection is closed
KEEP_ALIVE_S = 5.0  # an idle connection between requests


def run(state: ServerState, host: str, port: int) -> None:
    """Serve until stopped; a stop asked for (Ctrl-C, SIGTERM) returns normally, and the models are unloaded."""
    config = uvicorn.Config(
        create_app(state),
        host=host,
        port=port,
        http=_Protocol,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(KEEP_ALIVE_S),
        limit_concurrency=state.config.max_connections,  # past it: 503 at once, not another task
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


class _Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a time limit on a request's headers: a client that opens
    connections and sends its headers a byte at a time (slowloris) cannot hold them open."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late, self.cycle)

    def _headers_late(self, cycle: Any) -> None:
        """No request has started since the timer was armed: the headers did not arrive in time."""
        if self.cycle is cycle and not self.transport.is_closing():
            self.transport.close()


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
