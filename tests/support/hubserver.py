"""A Hugging Face Hub on 127.0.0.1 for tests: the endpoints huggingface_hub calls, serving real files.

GET  /api/models/{owner}/{repo}[/revision/{rev}]   model info with siblings (size, LFS sha256)
HEAD /{owner}/{repo}/resolve/{rev}/{file}          X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size
GET  /{owner}/{repo}/resolve/{rev}/{file}          the bytes, with Range support

Faults per file: "corrupt" (one byte flipped), "short" (body cut, connection closed),
"drop-once" (connection dropped halfway, the first time only), "slow" (paced, for kill tests).
Every request is counted in ``requests``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Served:
    path: Path
    sha256: str
    size: int
    fault: str | None = None
    dropped: bool = False


@dataclass
class FakeHub:
    repos: dict[str, dict[str, Served]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    url: str = ""
    _server: Any = None

    def add(self, repo: str, name: str, path: Path, fault: str | None = None, sha256: str | None = None) -> None:
        digest = sha256 or _sha256(path)
        self.repos.setdefault(repo, {})[name] = Served(path, digest, path.stat().st_size, fault)

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_GET(self) -> None:
                hub._handle(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # --- request handling ---------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        self.requests.append(f"{h.command} {h.path}")
        path = h.path.split("?")[0]
        api = re.match(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?$", path)
        if api:
            return self._info(h, api.group(1))
        resolve = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if resolve:
            return self._file(h, resolve.group(1), resolve.group(3), head)
        self._error(h, 404, "Entry not found")

    def _info(self, h: BaseHTTPRequestHandler, repo: str) -> None:
        files = self.repos.get(repo)
        if files is None:
            return self._error(h, 404, "Repository not found", error_code="RepoNotFound")
        siblings = [
            {"rfilename": name, "size": s.size, "blobId": s.sha256[:40],
             "lfs": {"sha256": s.sha256, "size": s.size, "pointerSize": 134}}
            for name, s in files.items()
        ]  # fmt: skip
        body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _file(self, h: BaseHTTPRequestHandler, repo: str, name: str, head: bool) -> None:
        served = self.repos.get(repo, {}).get(name)
        if served is None:
            return self._error(h, 404, "Entry not found", error_code="EntryNotFound")
        start = 0
        ranged = re.match(r"bytes=(\d+)-", h.headers.get("Range", ""))
        if ranged:
            start = int(ranged.group(1))
        h.send_response(206 if ranged else 200)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{served.sha256}"')
        h.send_header("X-Linked-Etag", f'"{served.sha256}"')
        h.send_header("X-Linked-Size", str(served.size))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(served.size - start))
        if ranged:
            h.send_header("Content-Range", f"bytes {start}-{served.size - 1}/{served.size}")
        h.end_headers()
        if head:
            return
        self._body(h, served, start)

    def _body(self, h: BaseHTTPRequestHandler, served: Served, start: int) -> None:
        with served.path.open("rb") as handle:
            handle.seek(start)
            position = start
            while block := handle.read(1024 * 1024):
                if served.fault == "corrupt" and position <= served.size // 2 < position + len(block):
                    middle = served.size // 2 - position
                    block = block[:middle] + bytes([block[middle] ^ 0xFF]) + block[middle + 1 :]
                cut = served.fault == "short" or (served.fault == "drop-once" and not served.dropped)
                if cut and position + len(block) > served.size // 2:
                    served.dropped = True
                    h.wfile.write(block[: served.size // 2 - position])
                    h.wfile.flush()
                    h.close_connection = True
                    return
                if served.fault == "slow":
                    time.sleep(0.05)
                h.wfile.write(block)
                position += len(block)

    @staticmethod
    def _error(h: BaseHTTPRequestHandler, status: int, message: str, error_code: str = "") -> None:
        body = json.dumps({"error": message}).encode()
        h.send_response(status)
        if error_code:
            h.send_header("X-Error-Code", error_code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1024 * 1024):
            digest.update(block)
    return digest.hexdigest()
