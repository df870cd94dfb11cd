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
import http.client
import ipaddress
import socket
import ssl
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
        if ip in _NAT64:
            found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def address_allowed(ip: IpAddress, networks: Sequence[IpNetwork] = ()) -> bool:
    """Whether the server may connect to ``ip``: inside a network the operator named, else a public
    unicast address (and so is every IPv4 address it embeds)."""
    if any(ip.version == net.version and ip in net for net in networks):
        return True
    return all(a.is_global and not a.is_multicast for a in _embedded(ip))


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


class _Http(http.client.HTTPConnection):
    def __init__(self, host: str, address: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _Https(http.client.HTTPSConnection):
    def __init__(self, host: str, address: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def fetch(url: str, policy: UrlPolicy) -> bytes:
    """The image at ``url`` (blocking), under ``policy``; BadImage says why not."""
    deadline = time.monotonic() + policy.timeout_s
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
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadImage(f"the image URL took over {policy.timeout_s:g} s")
        kind = _Https if parts.scheme == "https" else _Http
        connection = kind(parts.hostname, address, port, timeout=left)
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
            if isinstance(exc, TimeoutError | socket.timeout):
                raise BadImage(f"the image URL took over {policy.timeout_s:g} s") from None
            if isinstance(exc, ssl.SSLError):
                raise BadImage(f"the image URL's TLS failed: {exc.reason or exc}") from None
            raise BadImage(f"the image URL could not be fetched: {exc.__class__.__name__}") from None
        finally:
            connection.close()
    raise BadImage(f"the image URL redirected more than {MAX_REDIRECTS} times")


def _body(response: http.client.HTTPResponse, policy: UrlPolicy, deadline: float) -> bytes:
    declared = response.getheader("Content-Length")
    if declared and declared.isdigit() and int(declared) > policy.max_bytes:
        raise BadImage(f"the image at the URL is over {format_bytes(policy.max_bytes)}")
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read(65536):
        size += len(chunk)
        if size > policy.max_bytes:
            raise BadImage(f"the image at the URL is over {format_bytes(policy.max_bytes)}")
        if time.monotonic() > deadline:
            raise BadImage(f"the image URL took over {policy.timeout_s:g} s")
        chunks.append(chunk)
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


async def fetch_images(body: Any, policy: UrlPolicy, model: str, sees_images: bool) -> Any:
    """The chat request with its http(s) image URLs fetched and put in as data URLs (a fresh copy; the
    request's own parsing then checks them as any data URL). A part that cannot be fetched is a 400."""
    parts = _remote_parts(body)
    if not parts:
        return body
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
