"""The server's guard, as pure rules over request headers: which Host names a loopback server answers (DNS
rebinding), which browser requests it refuses (cross-site), the key and the body's size."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from llmrun.api.errors import ApiError
from llmrun.server.errors import without_paths
from llmrun.server.guard import Policy, check, host_allowed, host_name, refused_origin


@pytest.mark.parametrize(
    ("header", "name"),
    [("localhost:8080", "localhost"), ("[::1]:8080", "::1"), ("[::1]", "::1"), ("Example.COM", "example.com")],
)
def test_a_host_header_is_read_without_its_port(header: str, name: str) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("localhost:8080", True),
        ("LOCALHOST", True),
        ("app.localhost:8080", True),  # RFC 6761: *.localhost is loopback
        ("127.0.0.1:8080", True),
        ("127.9.9.9", True),
        ("[::1]:8080", True),
        (None, True),  # no Host at all (HTTP/1.0): never a browser
        ("evil.example", False),
        ("evil.example:8080", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.nip.io", False),
        ("0.0.0.0:8080", False),
        ("192.168.1.5:8080", False),
        ("[::ffff:127.0.0.1]", True),  # (the address is loopback)
        ("my.box:8080", True),  # named with --allowed-host
    ],
)
def test_a_loopback_server_answers_loopback_names_and_the_operators(header: str | None, allowed: bool) -> None:
    assert host_allowed(header, ("my.box",)) is allowed


def test_an_open_bind_answers_any_name_unless_hosts_are_named() -> None:
    assert host_allowed("evil.example", None)
    assert host_allowed("evil.example", ("*",))
    assert not host_allowed("evil.example", ("my.box",))


def headers(**values: str) -> Headers:
    return Headers({name.replace("_", "-"): value for name, value in values.items()})


@pytest.mark.parametrize(
    ("given", "method", "path", "refused"),
    [
        ({}, "POST", "/v1/chat/completions", False),  # curl, the SDKs, the agents: no Origin
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}, "POST", "/v1/chat/completions", False),
        ({"host": "localhost:8080", "origin": "http://localhost:8080"}, "POST", "/api/chat", False),
        ({"host": "127.0.0.1:8080", "origin": "http://localhost:8080"}, "POST", "/v1/models", True),  # another origin
        ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:3000"}, "POST", "/v1/completions", True),
        ({"host": "127.0.0.1:8080", "origin": "https://evil.example"}, "POST", "/v1/completions", True),
        ({"host": "127.0.0.1:8080", "origin": "null"}, "POST", "/v1/completions", True),  # a sandboxed frame
        ({"host": "127.0.0.1:8080", "origin": "http://app.test:5173"}, "POST", "/v1/completions", False),  # --cors
        ({"host": "127.0.0.1:8080", "origin": "vscode-webview://1abc"}, "POST", "/api/chat", False),  # an editor
        ({"host": "127.0.0.1:8080", "origin": "app://obsidian.md"}, "POST", "/api/chat", False),  # a desktop app
        ({"host": "127.0.0.1:8080", "origin": "javascript:alert(1)"}, "POST", "/api/chat", True),  # no such scheme
        ({"host": "127.0.0.1:8080", "sec_fetch_site": "cross-site"}, "GET", "/v1/models", True),
        (
            {"host": "127.0.0.1:8080", "sec_fetch_site": "cross-site", "sec_fetch_mode": "no-cors"},
            "POST",
            "/api/tags",
            True,
        ),
        ({"host": "127.0.0.1:8080", "sec_fetch_site": "same-origin"}, "GET", "/v1/models", False),
        ({"host": "127.0.0.1:8080", "sec_fetch_site": "none"}, "GET", "/", False),  # typed in the address bar
        # a link to the page from another site: shown to the user, unreadable by the site
        ({"host": "127.0.0.1:8080", "sec_fetch_site": "cross-site", "sec_fetch_mode": "navigate"}, "GET", "/", False),
        (
            {"host": "127.0.0.1:8080", "sec_fetch_site": "cross-site", "sec_fetch_mode": "navigate"},
            "GET",
            "/v1/models",
            True,
        ),
    ],
)
def test_a_browsers_request_from_another_site_is_refused(
    given: dict[str, str], method: str, path: str, refused: bool
) -> None:
    why = refused_origin(headers(**given), method, path, ("http://app.test:5173",))
    assert (why is not None) is refused


def test_every_origin_with_a_star() -> None:
    assert (
        refused_origin(headers(host="127.0.0.1:8080", origin="https://evil.example"), "POST", "/v1/models", ("*",))
        is None
    )


def status(policy: Policy, method: str = "POST", path: str = "/v1/chat/completions", **given: str) -> int:
    try:
        check(headers(**given), method, path, policy)
    except ApiError as exc:
        return exc.status
    return 200


def test_the_rules_in_order_host_origin_key_size() -> None:
    policy = Policy(api_key="k" * 12, max_body_bytes=100)
    assert status(policy, host="evil.example", authorization="Bearer " + "k" * 12) == 403
    assert status(policy, host="localhost", origin="http://evil.example") == 403  # before the key is asked for
    assert status(policy, host="localhost") == 401
    assert status(policy, host="localhost", authorization="Bearer " + "x" * 12) == 401
    assert status(policy, host="localhost", authorization="Bearer " + "k" * 12) == 200
    assert status(policy, host="localhost", authorization="Bearer " + "k" * 12, content_length="101") == 413
    assert status(policy, "GET", "/health", host="localhost") == 200  # probes need no key
    assert status(policy, "GET", "/", host="localhost") == 200  # the page asks for the key itself
    assert status(policy, "GET", "/health", host="evil.example") == 403  # but still only for loopback names


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("no manifest in /home/alice/.ollama/models/manifests/x/latest", "no manifest in latest"),
        (
            "cannot read /tmp/pytest-1/gemma-3-270m-q4_k_m.gguf: truncated",
            "cannot read gemma-3-270m-q4_k_m.gguf: truncated",
        ),
        ("model 'C:\\Users\\bob\\m.gguf' not found", "model 'm.gguf' not found"),
        ("see ~/.cache/llmrun/x.gguf", "see x.gguf"),
        ("no such endpoint: POST /v1/chat/completions", "no such endpoint: POST /v1/chat/completions"),
        ("no such endpoint: GET /api/tags", "no such endpoint: GET /api/tags"),
        ("fetch http://127.0.0.1:8080/a/b.png", "fetch http://127.0.0.1:8080/a/b.png"),
        ("top_p must be in (0, 1]", "top_p must be in (0, 1]"),
    ],
)
def test_error_messages_carry_no_file_paths(text: str, shown: str) -> None:
    assert without_paths(text) == shown
