"""Who may use the server, checked on every request before anything runs: the Host name it was asked by
(DNS rebinding), the browser's origin (cross-site requests), the key, the body's size.

The rules are pure functions of the request's headers (tested without a server); :class:`Guard` is the
ASGI middleware that applies them and counts every request by endpoint and status.

- **Host.** A server bound to loopback answers only the names that mean this machine (``localhost``,
  ``*.localhost``, 127.0.0.0/8, ``[::1]``) and the operator's ``--allowed-host`` names: a page whose own
  name was rebound to 127.0.0.1 sends its own name and is refused (Ollama's answer to CVE-2024-28224).
  An open bind (which needs a key) checks Host only when the operator names hosts.
- **Origin.** A request a browser marks as another site's (an ``Origin`` that is neither the server's
  own nor one of ``--cors-origin``, or ``Sec-Fetch-Site: cross-site``) is refused, whatever its method
  and Content-Type: a ``text/plain`` POST that needs no preflight never reaches a route. Programs that
  are not browsers send neither header and are served as before (``curl -d``, the SDKs, the agents); an
  editor's or a desktop app's own pages (``vscode-webview://``, ``app://``: origins no web site can have)
  are answered, as Ollama answers them.
  The one cross-site request answered is a top-level navigation to the page (a link to it): the other
  site cannot read what it shows.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmrun.api.errors import ApiError
from llmrun.server import web
from llmrun.server.errors import error_response
from llmrun.server.metrics import Metrics

OPEN_PATHS = ("/health",)  # answered without a key (load balancers, probes)
ANY = "*"  # --allowed-host '*' / --cors-origin '*': every name / every origin


@dataclass(frozen=True, slots=True)
class Policy:
    """What the guard allows. ``hosts``: the Host names answered besides loopback ones (None: any
    name, an open bind's default); ``origins``: browser origins besides the server's own."""

    api_key: str | None = None
    hosts: tuple[str, ...] | None = ()
    origins: tuple[str, ...] = ()
    max_body_bytes: int = 4 * 1024 * 1024
    ui: bool = True


def host_name(header: str) -> str:
    """The name in a Host header, without its port (``[::1]:8080`` → ``::1``), lower-cased."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    name, _, port = value.rpartition(":")
    return name if name and (port.isdigit() or not port) else value


def is_loopback_name(name: str) -> bool:
    """``localhost``, ``*.localhost`` (RFC 6761: always loopback), or a loopback address."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def host_allowed(header: str | None, hosts: Sequence[str] | None) -> bool:
    """Whether a request with this Host header is answered. No header (HTTP/1.0, never a browser): yes."""
    if hosts is None or ANY in hosts or not header:
        return True
    name = host_name(header)
    return is_loopback_name(name) or name in {host_name(h) for h in hosts}


def own_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` is the server's own: the page it serves, at the name and port it was asked by."""
    scheme, _, rest = origin.partition("://")
    return bool(host) and scheme in ("http", "https") and rest.rstrip("/").lower() == (host or "").strip().lower()


def app_origin(origin: str) -> bool:
    """An origin no web site can have: a desktop app's or an editor's own scheme (``vscode-webview://…``,
    ``app://…``, ``tauri://…``, ``file://``), as Ollama allows them by default. ``null`` (a sandboxed frame
    of any site, or a redirect) and http(s) are web origins."""
    scheme, separator, _ = origin.partition("://")
    return bool(separator) and scheme.lower() not in ("http", "https") and scheme.replace("-", "").isalnum()


def refused_origin(headers: Headers, method: str, path: str, origins: Sequence[str]) -> str | None:
    """Why a browser's request from another site is refused (None: it is not, or it is not a browser's)."""
    origin = headers.get("origin")
    if origin is not None:
        if own_origin(origin, headers.get("host")) or ANY in origins or origin.rstrip("/") in origins:
            return None
        if app_origin(origin):
            return None  # an editor's or a desktop app's own pages (vscode-webview://, app://): not a web site
        return f"requests from the web page at {origin} are not allowed"
    if headers.get("sec-fetch-site", "").lower() != "cross-site":
        return None
    navigation = headers.get("sec-fetch-mode", "").lower() == "navigate" and method in ("GET", "HEAD")
    if navigation and web.is_page_path(path):
        return None  # a link to the page from another site: the user sees it, the site cannot read it
    return "requests from another site are not allowed"


def authorize(headers: Headers, method: str, path: str, key: str | None) -> None:
    if key is None or path in OPEN_PATHS or method == "OPTIONS":
        return
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        given = headers.get("x-api-key", "")  # Anthropic's clients send the key so
        if not given:
            raise ApiError(401, "missing API key: send Authorization: Bearer KEY", code="missing_api_key")
    if not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise ApiError(401, "incorrect API key", code="invalid_api_key")


def check(headers: Headers, method: str, path: str, policy: Policy) -> None:
    """Every rule in turn; an :class:`ApiError` names the first one the request breaks."""
    if not host_allowed(headers.get("host"), policy.hosts):
        name = host_name(headers.get("host", ""))
        raise ApiError(
            403,
            f"this server does not answer requests for the host name {name!r} (its operator can allow it "
            "with --allowed-host)",
            code="host_not_allowed",
        )
    why = refused_origin(headers, method, path, policy.origins)
    if why is not None:
        raise ApiError(403, f"{why} (its operator can allow an origin with --cors-origin)", code="origin_not_allowed")
    if not (policy.ui and web.is_page_path(path)):  # the page asks for the key itself
        authorize(headers, method, path, policy.api_key)
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > policy.max_body_bytes:
        raise ApiError(413, f"the request body is over {policy.max_body_bytes} bytes", code="request_too_large")


class Guard:
    """Every request: :func:`check` before anything runs, and counted by endpoint and status. A plain ASGI
    middleware, not Starlette's ``BaseHTTPMiddleware`` (``@app.middleware``): through that one a route
    never sees its client go away (``Request.is_disconnected`` stays False, starlette discussion 2094),
    so a request nobody waits for would keep its slot."""

    def __init__(self, app: ASGIApp, policy: Policy, metrics: Metrics, known: frozenset[str]) -> None:
        self.app = app
        self.policy = policy
        self.metrics = metrics
        self.known = known

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        endpoint = request.url.path
        status = 500  # unless a response starts

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            try:
                check(request.headers, request.method, endpoint, self.policy)
            except ApiError as exc:
                await error_response(exc, endpoint)(scope, receive, counted)
                return
            await self.app(scope, receive, counted)
        finally:
            self.metrics.requests.labels(endpoint if endpoint in self.known else "other", str(status)).inc()
