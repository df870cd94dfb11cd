"""Fetching the ``http(s)`` image URLs of OpenAI chat requests, for a server started with
``--allow-image-urls``: only what a client could fetch from the public internet itself.

Off by default: a request's URL is the client's choice, and a server that fetches it can be made to reach
what only it can reach (its own loopback, the local network, a cloud's metadata address). With the flag:

- the scheme is ``http`` or ``https`` (never ``file://``, ``ftp://`` …); no user name or password in the URL;
- the host name is resolved once and *every* address it resolves to must be public (not loopback, private,
  link-local, shared, multicast, reserved or unspecified — also when embedded in IPv6: IPv4-mapped, 6to4,
  Teredo, NAT64), unless it lies in a network the operator named (``--image-url-network``); the connection
  goes to the address that was checked (a second lookup could answer differently), with TLS still checking
  the certificate against the name;
- redirects are followed at most three times, each one checked the same way;
- the whole fetch has a time limit, the body a size limit (the image limit: 32 MB), checked as it arrives;
- nothing from the request travels with it (no cookies, no keys, no proxy from the environment), and what
  comes back must be a PNG, JPEG, GIF or BMP by its own bytes (its ``Content-Type`` is not trusted).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from llmrun.api.errors import ApiError
from llmrun.api.images import BadImage
from llmrun.formats.image import MAX_IMAGE_BYTES, ImageError, sniff
from llmrun.units import format_bytes

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_REDIRECTS = 3
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")  # ::a.b.c.d
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # ::ffff:0:a.b.c.d
_MIME = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "bmp": "image/bmp"}


@dataclass(frozen=True, slots=True)
class UrlPolicy:
    """What the server may fetch: public addresses, and the operator's ``networks`` besides."""

    networks: tuple[IpNetwork, ...] = ()
    timeout_s: float = 10.0  # the whole fetch of one image, redirects included
    max_bytes: int = MAX_IMAGE_BYTES


def parse_networks(values: Sequence[str]) -> tuple[IpNetwork, ...]:
    """``--image-url-network`` values (``10.0.0.0/8``, ``192.168.1.20``, ``fd00::/8``); ValueError names a bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP network (e.g. 10.0.0.0/8 or 192.168.1.20)") from None
    return tuple(networks)


def _embedded(ip: IpAddress) -> list[IpAddress]:
    """The address and any IPv4 address an IPv6 one carries (mapped, 6to4, Teredo, NAT64)."""
    found: list[IpAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            found.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            found.append(ip.sixtofour)
        if ip.teredo is not None:
            found.extend(ip.teredo)
        if ip in _NAT64 or ip in _COMPATIBLE or ip in _TRANSLATED:
            found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


# IANA's special-purpose registries, written out: ``is_global``'s answers differ between Python versions
# (on 3.11.7 it calls ::127.0.0.1, ::ffff:0:7f00:1, 64:ff9b:1::/48 and fec0::/10 global)
NOT_PUBLIC: tuple[IpNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/96",  # unspecified, loopback, IPv4-compatible (::127.0.0.1, deprecated)
        "::ffff:0:0/96",  # IPv4-mapped (checked by the address it embeds too)
        "::ffff:0:0:0/96",  # IPv4-translated (::ffff:0:7f00:1)
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard-only
        "2001::/23",  # IETF protocol assignments (Teredo's 2001::/32 among them, checked by what it embeds)
        "2001:db8::/32",  # documentation
        "2002::/16",  # 6to4 (checked by what it embeds too)
        "3fff::/20",  # documentation
        "5f00::/16",  # segment routing
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)


def address_allowed(ip: IpAddress, networks: Sequence[IpNetwork] = ()) -> bool:
    """Whether the server may connect to ``ip``: inside a network the operator named, else a public
    unicast address (and so is every IPv4 address it embeds): outside every network of :data:`NOT_PUBLIC`,
    and ``is_global`` besides."""
    if any(ip.version == net.version and ip in net for net in networks):
        return True
    return all(_public(a) for a in _embedded(ip))


def _public(ip: IpAddress) -> bool:
    if any(ip.version == net.version and ip in net for net in NOT_PUBLIC):
        return False
    return ip.is_global and not ip.is_multicast


def _resolve(host: str, port: int, policy: UrlPolicy) -> str:
    """The address to connect to: every address ``host`` resolves to must be allowed (one bad answer
    refuses the name: which one a connection would use is not ours to choose)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise BadImage(f"the image URL's host {host} could not be resolved") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    refused = [a for a in addresses if not address_allowed(a, policy.networks)]
    if not addresses or refused:
        raise BadImage(
            f"the image URL's host {host} is at {refused[0] if refused else 'no address'}, which this server does not "
            "fetch from (loopback, private, link-local and other non-public addresses are refused)"
        )
    return str(addresses[0])


class _Deadline:
    """The whole fetch's time limit, enforced on the socket itself: at the deadline the connection is shut
    down, so a server that trickles a byte at a time cannot hold a read past it."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()
        self._lock = threading.Lock()
        self.expired = False

    def left(self) -> float:
        return self.at - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            if self.expired:
                sock.close()
                raise TimeoutError
            self._sockets.append(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _connect(address: str, port: int, deadline: _Deadline) -> socket.socket:
    sock = socket.create_connection((address, port), max(deadline.left(), 0.001))
    deadline.watch(sock)
    return sock


class _Http(http.client.HTTPConnection):
    def __init__(self, host: str, address: str, port: int, deadline: _Deadline) -> None:
        super().__init__(host, port, timeout=max(deadline.left(), 0.001))
        self._address = address
        self._deadline = deadline

    def connect(self) -> None:
        self.sock = _connect(self._address, self.port, self._deadline)


class _Https(http.client.HTTPSConnection):
    def __init__(self, host: str, address: str, port: int, deadline: _Deadline) -> None:
        super().__init__(host, port, timeout=max(deadline.left(), 0.001), context=ssl.create_default_context())
        self._address = address
        self._deadline = deadline

    def connect(self) -> None:
        raw = _connect(self._address, self.port, self._deadline)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def fetch(url: str, policy: UrlPolicy) -> bytes:
    """The image at ``url`` (blocking), under ``policy``; BadImage says why not."""
    deadline = _Deadline(policy.timeout_s)
    try:
        return _fetch(url, policy, deadline)
    except (OSError, http.client.HTTPException) as exc:  # the deadline shut the socket mid-read
        if deadline.expired or isinstance(exc, TimeoutError | socket.timeout):
            raise BadImage(f"the image URL took over {policy.timeout_s:g} s") from None
        raise BadImage(f"the image URL could not be fetched: {exc.__class__.__name__}") from None
    finally:
        deadline.cancel()


def _fetch(url: str, policy: UrlPolicy, deadline: _Deadline) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadImage("an image URL must be http(s)://HOST/… or a data URL")
        if parts.username is not None or parts.password is not None:
            raise BadImage("an image URL must not carry a user name or password")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise BadImage("the image URL's port is not a number") from None
        address = _resolve(parts.hostname, port, policy)
        if deadline.left() <= 0:
            raise BadImage(f"the image URL took over {policy.timeout_s:g} s")
        kind = _Https if parts.scheme == "https" else _Http
        connection = kind(parts.hostname, address, port, deadline)
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.request(
                "GET",
                target,
                headers={"User-Agent": "llmrun", "Accept": "image/*", "Accept-Encoding": "identity"},
            )
            response = connection.getresponse()
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                url = urljoin(url, response.getheader("Location", ""))
                continue
            if response.status != 200:
                raise BadImage(f"the image URL answered HTTP {response.status}")
            return _body(response, policy, deadline)
        except (OSError, http.client.HTTPException) as exc:
            if deadline.expired or isinstance(exc, TimeoutError | socket.timeout):
                raise BadImage(f"the image URL took over {policy.timeout_s:g} s") from None
            if isinstance(exc, ssl.SSLError):
                raise BadImage(f"the image URL's TLS failed: {exc.reason or exc}") from None
            raise BadImage(f"the image URL could not be fetched: {exc.__class__.__name__}") from None
        finally:
            connection.close()
    raise BadImage(f"the image URL redirected more than {MAX_REDIRECTS} times")


def _body(response: http.client.HTTPResponse, policy: UrlPolicy, deadline: _Deadline) -> bytes:
    declared = response.getheader("Content-Length")
    if declared and declared.isdigit() and int(declared) > policy.max_bytes:
        raise BadImage(f"the image at the URL is over {format_bytes(policy.max_bytes)}")
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read(65536):
        size += len(chunk)
        if size > policy.max_bytes:
            raise BadImage(f"the image at the URL is over {format_bytes(policy.max_bytes)}")
        chunks.append(chunk)
    if deadline.expired:  # the socket was shut down at the deadline: what came is not the whole image
        raise BadImage(f"the image URL took over {policy.timeout_s:g} s")
    data = b"".join(chunks)
    try:
        sniff(data)
    except ImageError as exc:
        raise BadImage(f"what the URL sent is not an image this server reads: {exc.message}") from None
    return data


def _remote_parts(body: Any) -> list[tuple[str, dict[str, Any]]]:
    """(param, the part's ``image_url`` object) for each http(s) image of a chat request's user messages."""
    found: list[tuple[str, dict[str, Any]]] = []
    messages = body.get("messages") if isinstance(body, dict) else None
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or message.get("role") != "user":
            continue
        for j, part in enumerate(content):
            image = part.get("image_url") if isinstance(part, dict) and part.get("type") == "image_url" else None
            url = image.get("url") if isinstance(image, dict) else None
            if isinstance(url, str) and url.lower().startswith(("http://", "https://")):
                found.append((f"messages[{i}].content[{j}].image_url", image))  # type: ignore[arg-type]
    return found


# a 1×1 PNG: what stands for each image URL while the rest of the request is checked, before any fetch
PLACEHOLDER = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="
)


def image_url_count(body: Any) -> int:
    return len(_remote_parts(body))


def with_placeholders(body: Any) -> Any:
    """The chat request with each http(s) image URL replaced by :data:`PLACEHOLDER` (a fresh copy): the
    request is checked whole before the server fetches anything for it."""
    import copy

    parts = _remote_parts(body)
    if not parts:
        return body
    body = copy.deepcopy(body)
    for _, image in _remote_parts(body):
        image["url"] = PLACEHOLDER
    return body


async def fetch_images(body: Any, policy: UrlPolicy, model: str, sees_images: bool) -> Any:
    """The chat request with its http(s) image URLs fetched and put in as data URLs (a fresh copy; the
    request's own parsing then checks them as any data URL). A part that cannot be fetched is a 400;
    more than :data:`~llmrun.api.limits.MAX_IMAGE_URLS` URLs is a 400 before any is fetched."""
    from llmrun.api import limits
    from llmrun.api.errors import over_limit

    parts = _remote_parts(body)
    if not parts:
        return body
    try:
        limits.image_urls(len(parts))
    except limits.OverLimit as exc:
        raise over_limit(exc) from None
    if not sees_images:
        raise ApiError(
            400,
            f"{model} does not see images: it was loaded without a projector",
            param=parts[0][0],
            code="invalid_image",
        )
    import copy

    body = copy.deepcopy(body)
    for param, image in _remote_parts(body):
        try:
            data = await asyncio.wait_for(asyncio.to_thread(fetch, image["url"], policy), policy.timeout_s + 1)
        except TimeoutError:
            message = f"the image URL took over {policy.timeout_s:g} s"
            raise ApiError(400, message, param=param, code="invalid_image") from None
        except BadImage as exc:
            raise ApiError(400, str(exc), param=param, code="invalid_image") from None
        mime = _MIME[sniff(data).format]
        image["url"] = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return body
