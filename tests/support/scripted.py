"""A real HTTP server on 127.0.0.1 that misbehaves on purpose, one way per path prefix, to drive each
failure of a remote engine through the real client: ``/ok``, ``/auth`` (401), ``/forbidden`` (403),
``/busy`` (429 twice, then an answer), ``/down`` (503 always), ``/cut`` (the stream stops mid-answer),
``/picky`` (400 for top_k), ``/missing`` (404 for any model; serves a and b). Each path's requests are
counted and their Authorization headers kept, so a test can see retries and what was sent."""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = ["Hel", "lo", " there"]


class Script:
    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.auth: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            prefix = self.path.split("/")[1]
            if self.path.endswith("/v1/models"):
                served = ["a", "b"] if prefix == "missing" else ["scripted"]
                self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in served]})
            elif self.path.endswith("/health"):
                self._json(200, {"status": "ok", "slots": {"total": 2, "busy": 0, "idle": 2}})
            else:
                self._json(404, {"error": {"message": "no such path"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            prefix = self.path.split("/")[1]
            with script.lock:
                script.hits[prefix] += 1
                count = script.hits[prefix]
                script.auth.append(self.headers.get("Authorization", ""))
                script.bodies.append(body)
            if prefix in ("auth", "forbidden"):
                status = 401 if prefix == "auth" else 403
                self._json(status, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
            elif prefix == "busy" and count <= 2:
                self._json(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"})
            elif prefix == "down":
                self._json(503, {"error": {"message": "overloaded"}}, {"Retry-After": "0"})
            elif prefix == "picky" and "top_k" in body:
                self._json(400, {"error": {"message": "Unrecognized request argument supplied: top_k"}})
            elif prefix == "missing":
                self._json(404, {"error": {"message": f"model {body.get('model')} not found"}})
            elif prefix == "cut":
                self._stream(ANSWER[:2], complete=False)
            else:
                self._stream(ANSWER, complete=True)

        def _stream(self, pieces: list[str], *, complete: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            events = [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
            if complete:
                events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                events.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": len(pieces)}})
            for event in events:
                self._chunk(f"data: {json.dumps(event)}\n\n".encode())
            if complete:
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True  # an incomplete chunked body: the connection just ends

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


@contextlib.contextmanager
def serving() -> Iterator[tuple[str, Script]]:
    """The server's root URL and its record, while the block runs."""
    script = Script()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()
