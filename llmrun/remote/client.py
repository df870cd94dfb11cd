"""HTTP to one OpenAI-compatible endpoint (httpx; server-sent events through httpx-sse).

Every failure becomes one :class:`RemoteError` line that names the host (never the key): unreachable,
TLS, timeouts, 401/403 (naming the key's variable), 404 (listing what the endpoint serves), 400 (naming
the setting it rejected), and 429/5xx after a bounded number of retries with backoff that honours
``Retry-After``. A stream cut mid-answer is an error too, marked retryable, with what came before it kept
by the caller.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from llmrun.errors import RemoteError
from llmrun.models.endpoint import Endpoint
from llmrun.remote.wire import EXTRA_FIELDS, error_message, served_models

if TYPE_CHECKING:
    import httpx

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 300.0  # between two chunks of a stream (a long prefill on a busy engine)
MAX_WAIT = 30.0  # the longest Retry-After honoured


class Client:
    """One endpoint. ``retries``: extra tries after a 429 or 5xx (0: none); ``sleep`` waits between them."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        read_timeout: float = READ_TIMEOUT,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import httpx

        self.endpoint = endpoint
        self.retries = retries
        self.backoff = backoff
        self._sleep = sleep
        headers = {"Accept": "application/json"}
        key = endpoint.key
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(
            headers=headers, timeout=httpx.Timeout(read_timeout, connect=CONNECT_TIMEOUT), follow_redirects=False
        )
        self._model: str | None = endpoint.model

    def close(self) -> None:
        self._http.close()

    # --- what it serves ------------------------------------------------------------
    def models(self) -> list[str]:
        return served_models(self.get("/models"))

    def model(self) -> str:
        """The model as the endpoint serves it: the one named, else its only one."""
        if self._model is None:
            served = self.models()
            if len(served) != 1:
                listed = ", ".join(served) if served else "nothing"
                raise RemoteError(
                    f"{self.endpoint.host} serves {len(served)} models ({listed}); which one?",
                    "name it with -m (as the endpoint spells it)",
                )
            self._model = served[0]
        return self._model

    def get(self, path: str, *, root: bool = False) -> Any:
        url = (self.endpoint.root if root else self.endpoint.url) + path
        response = self._send(lambda: self._http.get(url))
        if response.status_code >= 400:
            raise self._status_error(response, path)
        return _json(response, self.endpoint)

    def probe(self, path: str) -> Any:
        """``GET`` a path under the server's root once, without retries; None on any failure (a probe)."""
        try:
            response = self._http.get(self.endpoint.root + path, timeout=CONNECT_TIMEOUT)
            return response.json() if response.status_code == 200 else None
        except Exception:  # a probe says only whether it worked
            return None

    # --- completions ----------------------------------------------------------------
    def stream(self, route: str, body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        """``("chunk", data)`` for each streamed event, or one ``("whole", data)`` when the endpoint
        answered without streaming. Retries (429/5xx) happen before the first byte only."""
        import httpx
        from httpx_sse import EventSource

        url = self.endpoint.url + route
        for attempt in range(self.retries + 1):
            with self._opened(lambda: self._http.stream("POST", url, json=body)) as response:
                if response.status_code in RETRY_STATUSES and attempt < self.retries:
                    response.read()
                    self._sleep(self._wait(response, attempt))
                    continue
                if response.status_code >= 400:
                    response.read()
                    raise self._status_error(response, route, body)
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    response.read()
                    yield "whole", _json(response, self.endpoint)
                    return
                seen = 0
                try:
                    for event in EventSource(response).iter_sse():
                        if event.data.strip() == "[DONE]":
                            return
                        if not event.data.strip():
                            continue
                        try:
                            data = json.loads(event.data)
                        except ValueError:
                            raise RemoteError(
                                f"{self.endpoint.host} sent a stream event that is not JSON", "is it an OpenAI API?"
                            ) from None
                        if isinstance(data, dict) and "error" in data:
                            message = error_message(data, "an error")
                            raise RemoteError(f"{self.endpoint.host} failed mid-answer: {message}", retryable=True)
                        seen += 1
                        yield "chunk", data
                except httpx.TransportError as exc:
                    raise RemoteError(
                        f"the answer from {self.endpoint.host} was cut off after {seen} chunks ({_why(exc)})",
                        "what arrived was kept; try again",
                        retryable=True,
                    ) from None
                return  # the stream ended without [DONE]: what came is the answer
        raise AssertionError("unreachable")

    # --- plumbing -------------------------------------------------------------------
    def _opened(self, open_stream: Callable[[], Any]) -> Any:
        """A streaming response's context, with connection failures worded."""
        import contextlib

        @contextlib.contextmanager
        def opened() -> Iterator[httpx.Response]:
            try:
                with open_stream() as response:
                    yield response
            except RemoteError:
                raise
            except Exception as exc:  # httpx's errors, each worded below
                raise self._transport_error(exc) from None

        return opened()

    def _send(self, call: Callable[[], httpx.Response]) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response = call()
            except Exception as exc:
                raise self._transport_error(exc) from None
            if response.status_code in RETRY_STATUSES and attempt < self.retries:
                self._sleep(self._wait(response, attempt))
                continue
            return response
        raise AssertionError("unreachable")

    def _wait(self, response: httpx.Response, attempt: int) -> float:
        """How long to wait before the next try: the endpoint's ``Retry-After``, else exponential backoff."""
        after = retry_after(response.headers.get("retry-after"))
        return min(after if after is not None else self.backoff * 2**attempt, MAX_WAIT)

    def _transport_error(self, exc: Exception) -> RemoteError:
        import httpx

        host = self.endpoint.host
        if isinstance(exc, httpx.ConnectTimeout):
            return RemoteError(f"{host} did not accept a connection within {CONNECT_TIMEOUT:.0f} s", _UP, down=True)
        if isinstance(exc, httpx.ConnectError):
            text = str(exc)
            if "SSL" in text or "certificate" in text.lower():
                return RemoteError(
                    f"TLS failed talking to {host}: {_short(text)}",
                    "check its certificate (SSL_CERT_FILE for a private CA), or use http:// for a plain server",
                )
            return RemoteError(f"cannot reach {host}: {_why(exc)}", _UP, down=True)
        if isinstance(exc, httpx.TimeoutException):
            return RemoteError(f"{host} stopped answering (no data for {READ_TIMEOUT:.0f} s)", _UP, retryable=True)
        if isinstance(exc, httpx.TransportError):
            return RemoteError(f"the connection to {host} failed: {_why(exc)}", _UP, retryable=True)
        raise exc

    def _status_error(self, response: httpx.Response, path: str, body: dict[str, Any] | None = None) -> RemoteError:
        host, status = self.endpoint.host, response.status_code
        try:
            data: Any = response.json()
        except ValueError:
            data = None
        message = _short(error_message(data, response.text.strip() or response.reason_phrase))
        if status in (401, 403):
            variable = self.endpoint.key_env
            hint = (
                f"the key in {variable} was not accepted; check it"
                if self.endpoint.key
                else f"the endpoint needs a key: set {variable}"
            )
            return RemoteError(f"{host} refused the request (HTTP {status}: {message})", hint, status=status)
        if status == 404:
            return self._not_found(path, body, message)
        if status in RETRY_STATUSES:
            tries = self.retries + 1
            return RemoteError(
                f"{host} answered HTTP {status} ({message}) {tries} time{'s' if tries > 1 else ''}",
                "the engine is overloaded or failing; try again later, or another endpoint",
                retryable=True,
                status=status,
            )
        named = _named_setting(message, body or {})
        if named:
            hint = f"drop `{named}` for this endpoint"
            return RemoteError(f"{host} rejected `{named}`: {message}", hint, status=status, setting=named)
        return RemoteError(f"{host} answered HTTP {status}: {message}", "", status=status)

    def _not_found(self, path: str, body: dict[str, Any] | None, message: str) -> RemoteError:
        host = self.endpoint.host
        model = body.get("model") if body else None
        if model is not None:
            try:
                served = served_models(self.get("/models"))
            except RemoteError:
                served = []
            if served and model not in served:
                return RemoteError(
                    f"{host} does not serve {model!r}; it serves: {', '.join(served)}",
                    "name one of those with -m",
                    status=404,
                )
        return RemoteError(
            f"{host} has no {self.endpoint.url.split(host, 1)[1]}{path} (HTTP 404: {message})",
            "check the URL: it is the API's base, e.g. http://HOST:PORT/v1",
            status=404,
        )


_UP = "is the server running at that address? (check the host, the port and the firewall)"


def retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    import email.utils  # (and with it socket, locale, calendar): only for a date, not at start-up

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _named_setting(message: str, body: dict[str, Any]) -> str | None:
    """The sampling setting an endpoint's 400 names, as llmrun calls it (``top_k``), if any."""
    for name, wire_names in EXTRA_FIELDS.items():
        if any(w in body and re.search(rf"\b{w}\b", message) for w in wire_names):
            return name
    for name in body:
        if name not in ("model", "messages", "prompt", "stream", "stream_options") and re.search(
            rf"\b{re.escape(name)}\b", message
        ):
            return name
    return None


def _json(response: httpx.Response, endpoint: Endpoint) -> Any:
    try:
        return response.json()
    except ValueError:
        raise RemoteError(
            f"{endpoint.host} answered with something that is not JSON", "is the URL an OpenAI-compatible API?"
        ) from None


def _why(exc: Exception) -> str:
    text = str(exc).strip()
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    if "Name or service not known" in text or "nodename nor servname" in text or "Errno -2" in text:
        return "unknown host name"
    return _short(text) or type(exc).__name__


def _short(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
