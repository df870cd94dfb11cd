"""An OpenAI-compatible endpoint: its base URL, the model it serves, and where its key comes from (pure)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from llmrun.errors import UsageError

if TYPE_CHECKING:
    pass

DEFAULT_KEY_ENV = "LLMRUN_API_KEY"  # the variable `llmrun serve` reads its key from, so llmrun fleets work as is


@dataclass(frozen=True, slots=True)
class Endpoint:
    """``url``: the API's base (``http://host:port/v1``); ``model``: the model as it serves it (None: its
    only one); ``key_env``: the environment variable holding its key (the key itself is never kept)."""

    url: str
    model: str | None = None
    key_env: str = DEFAULT_KEY_ENV

    @property
    def key(self) -> str | None:
        value = os.environ.get(self.key_env, "").strip()
        return value or None

    @property
    def host(self) -> str:
        """``host:port``, for messages (never the key, never a path)."""
        return urlsplit(self.url).netloc

    @property
    def root(self) -> str:
        """The server's root (``http://host:port``): where ``/health`` and ``/metrics`` live."""
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def base_url(text: str) -> str:
    """An endpoint as the user wrote it (``host:port``, ``http://host:port``, ``…/v1``) as the API's base URL."""
    value = text.strip()
    if not value:
        raise UsageError("an endpoint URL is empty", "e.g. `endpoint` http://127.0.0.1:8080/v1")
    if "://" not in value:
        value = f"http://{value}"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"endpoint {text!r} is not an http(s) URL", "e.g. `endpoint` http://127.0.0.1:8080/v1")
    if not parts.hostname:
        raise UsageError(f"endpoint {text!r} has no host", "e.g. `endpoint` http://127.0.0.1:8080/v1")
    if parts.username or parts.password:
        raise UsageError(
            "an endpoint URL must not carry credentials", f"put the key in an environment variable ({DEFAULT_KEY_ENV})"
        )
    try:
        parts.port  # noqa: B018 - raises for a bad port
    except ValueError:
        raise UsageError(f"endpoint {text!r} has a bad port", "e.g. http://127.0.0.1:8080/v1") from None
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost`` or a loopback address (names are not resolved)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
