"""`serve --allow-image-urls`: which addresses an image URL may be fetched from, and the fetch's limits,
against a real HTTP server on 127.0.0.1 (allowed here only as the operator's named network)."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from llmrun.api.errors import ApiError
from llmrun.api.images import BadImage, from_url
from llmrun.server.image_urls import (
    PLACEHOLDER,
    UrlPolicy,
    address_allowed,
    fetch,
    fetch_images,
    parse_networks,
    with_placeholders,
)
from tests.support import imagefiles

PNG = imagefiles.png_bytes(32, 24, seed=3)
LOCAL = UrlPolicy(parse_networks(["127.0.0.1/32"]), timeout_s=1.0, max_bytes=64 * 1024)


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("93.184.215.14", True),  # a public IPv4 address
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True),  # a public IPv6 address
        ("127.0.0.1", False),
        ("127.1.2.3", False),
        ("::1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # a cloud's metadata address
        ("fe80::1", False),
        ("fd00::1", False),
        ("100.64.0.1", False),  # shared address space (carrier NAT)
        ("224.0.0.1", False),
        ("240.0.0.1", False),
        ("255.255.255.255", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:169.254.169.254", False),
        ("2002:7f00:1::", False),  # 6to4 around 127.0.0.1
        ("2002:a00:1::", False),  # 6to4 around 10.0.0.1
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 around 169.254.169.254
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False),  # Teredo whose client is 10.0.0.1
        # forms whose is_global answer varies by Python version (3.11.7 calls them global): denied explicitly
        ("::127.0.0.1", False),  # IPv4-compatible (deprecated)
        ("::8.8.8.8", False),
        ("::ffff:0:7f00:1", False),  # IPv4-translated 127.0.0.1
        ("::ffff:0:808:808", False),  # IPv4-translated 8.8.8.8
        ("64:ff9b:1::a00:1", False),  # local-use NAT64
        ("fec0::1", False),  # site-local (deprecated)
        ("2001:db8::1", False),  # documentation
        ("100::1", False),  # discard-only
        ("ff02::1", False),  # multicast
        ("64:ff9b::808:808", True),  # NAT64 around a public address: public
    ],
)
def test_only_public_addresses_are_fetched_from(address: str, allowed: bool) -> None:
    assert address_allowed(ipaddress.ip_address(address)) is allowed


def test_the_operators_networks_are_allowed_and_nothing_else() -> None:
    networks = parse_networks(["10.0.0.0/8", "192.168.1.20"])
    assert address_allowed(ipaddress.ip_address("10.9.8.7"), networks)
    assert address_allowed(ipaddress.ip_address("192.168.1.20"), networks)
    assert not address_allowed(ipaddress.ip_address("192.168.1.21"), networks)
    assert not address_allowed(ipaddress.ip_address("127.0.0.1"), networks)
    with pytest.raises(ValueError, match="not an IP network"):
        parse_networks(["example.com"])


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("file:///etc/passwd", "must be http(s)"),
        ("ftp://example.com/a.png", "must be http(s)"),
        ("http:///a.png", "must be http(s)"),
        ("http://user:pw@example.com/a.png", "user name or password"),
        ("http://example.com:notaport/a.png", "port is not a number"),
        ("http://127.0.0.1/a.png", "127.0.0.1, which this server does not fetch from"),
        ("http://[::1]:8080/a.png", "::1, which this server does not fetch from"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        ("http://0x7f000001/a.png", "127.0.0.1"),  # another spelling of loopback
        ("http://no-such-host.invalid/a.png", "could not be resolved"),
    ],
)
def test_urls_refused_before_any_connection(url: str, expected: str) -> None:
    with pytest.raises(BadImage, match=re.escape(expected)):
        fetch(url, UrlPolicy())


class Files(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, Any]] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        route = self.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        status, headers, body = route(self) if callable(route) else route
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        for chunk in body if isinstance(body, list) else [body]:
            if chunk == b"<sleep>":
                time.sleep(2)
                continue
            if chunk == b"<trickle>":  # a byte every 0.2 s for 6 s: no single read ever waits past 1 s
                for byte in (PNG * 2)[:30]:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
                continue
            self.wfile.write(chunk)


@pytest.fixture(scope="module")
def files() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    Files.routes = {
        "/a.png": (200, {"Content-Type": "text/plain"}, PNG),  # the type it says is not trusted
        "/moved": (302, {"Location": "/a.png"}, b""),
        "/loop": (302, {"Location": "/loop"}, b""),
        "/to-other-loopback": (302, {"Location": base.replace("127.0.0.1", "127.0.0.2") + "/a.png"}, b""),
        "/to-file": (302, {"Location": "file:///etc/passwd"}, b""),
        "/big-declared": (200, {"Content-Length": str(10**9)}, b""),
        "/big": (200, {}, [PNG, b"\0" * 100_000]),
        "/slow": (200, {}, [PNG[:10], b"<sleep>", PNG[10:]]),
        "/trickle": (200, {}, [b"<trickle>"]),
        "/text": (200, {}, b"<html>not an image</html>"),
        "/bomb": (200, {}, imagefiles.png_header(20_000, 20_000)),
    }
    yield base
    server.shutdown()


def test_an_image_is_fetched_and_redirects_followed_within_limits(files: str) -> None:
    assert fetch(files + "/a.png", LOCAL) == PNG
    assert fetch(files + "/moved", LOCAL) == PNG
    cases = {
        "/loop": "redirected more than 3 times",
        "/to-other-loopback": "127.0.0.2, which this server does not fetch from",  # each hop checked
        "/to-file": "must be http(s)",
        "/missing.png": "answered HTTP 404",
        "/big-declared": "over 64.0 KiB",
        "/big": "over 64.0 KiB",
        "/slow": "took over 1 s",
        "/text": "not an image this server reads",
        "/bomb": "20000 × 20000",
    }
    for path, expected in cases.items():
        with pytest.raises(BadImage, match=re.escape(expected)):
            fetch(files + path, LOCAL)
    with pytest.raises(BadImage, match=re.escape("127.0.0.1, which this server")):
        fetch(files + "/a.png", UrlPolicy())  # without the operator's network: loopback


def test_a_chat_request_gets_data_urls_in_place_of_its_image_urls(files: str) -> None:
    def body(url: str, role: str = "user") -> dict[str, Any]:
        part = {"type": "image_url", "image_url": {"url": url}}
        return {"model": "m", "messages": [{"role": role, "content": [part, {"type": "text", "text": "Hi"}]}]}

    sent = body(files + "/a.png")
    fetched = asyncio.run(fetch_images(sent, LOCAL, "m", sees_images=True))
    assert sent["messages"][0]["content"][0]["image_url"]["url"] == files + "/a.png"  # the request is not changed
    assert from_url(fetched["messages"][0]["content"][0]["image_url"]["url"]) == PNG
    with pytest.raises(ApiError) as caught:
        asyncio.run(fetch_images(body(files + "/missing.png"), LOCAL, "m", sees_images=True))
    assert caught.value.status == 400 and caught.value.param == "messages[0].content[0].image_url"
    with pytest.raises(ApiError, match="m does not see images"):
        asyncio.run(fetch_images(body(files + "/a.png"), LOCAL, "m", sees_images=False))
    assert asyncio.run(fetch_images(body(files + "/a.png", "system"), LOCAL, "m", sees_images=True)) == body(
        files + "/a.png", "system"
    )  # not fetched: a system message's image is refused by the request's own parsing


def test_the_deadline_holds_against_a_server_that_trickles_bytes(files: str) -> None:
    """Each read gets a byte within 0.2 s, so a per-read timeout never fires: the socket is shut at the deadline."""
    started = time.monotonic()
    with pytest.raises(BadImage, match=re.escape("took over 1 s")):
        fetch(files + "/trickle", LOCAL)
    assert time.monotonic() - started < 2.5  # the deadline (1 s), not the 6 s the server would take


def image_body(*urls: str, **fields: Any) -> dict[str, Any]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": "m", "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "Hi"}]}], **fields}


def test_more_than_eight_urls_are_refused_before_any_fetch(files: str) -> None:
    hits: list[str] = []

    def counted(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        hits.append(handler.path)
        return 200, {}, PNG

    Files.routes["/counted.png"] = counted
    with pytest.raises(ApiError) as caught:
        asyncio.run(fetch_images(image_body(*[files + "/counted.png"] * 9), LOCAL, "m", sees_images=True))
    assert caught.value.status == 400 and "at most 8" in caught.value.message
    assert hits == []
    fetched = asyncio.run(fetch_images(image_body(*[files + "/counted.png"] * 8), LOCAL, "m", sees_images=True))
    assert len(hits) == 8 and len(fetched["messages"][0]["content"]) == 9


def test_the_body_is_checked_with_placeholders_before_any_fetch(files: str) -> None:
    """What the server parses before fetching: every URL replaced by a real 1×1 PNG, the rest as sent."""
    from llmrun.api.openai import Limits, parse_chat
    from llmrun.decoding.sampling import SamplingParams

    sent = image_body(files + "/a.png", "data:image/png;base64,AAAA", temperature=9)
    checked = with_placeholders(sent)
    assert checked["messages"][0]["content"][0]["image_url"]["url"] == PLACEHOLDER
    assert checked["messages"][0]["content"][1] == sent["messages"][0]["content"][1]  # a data URL stays
    assert sent["messages"][0]["content"][0]["image_url"]["url"] == files + "/a.png"
    with pytest.raises(ApiError) as caught:
        parse_chat(checked, SamplingParams(), Limits(max_tokens=16))
    assert caught.value.param in ("temperature", "messages[0].content[1].image_url")
    ok = with_placeholders(image_body(files + "/a.png"))
    assert parse_chat(ok, SamplingParams(), Limits(max_tokens=16)).requests[0].has_images  # the placeholder reads
