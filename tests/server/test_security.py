"""`llmrun serve` against the browser and the hostile client (docs/security.md), one check per finding,
against real server processes on 127.0.0.1: raw HTTP with explicit headers (httpx), the openai and ollama
SDKs, curl-shaped requests, and real headless Chromium (a page on another local port, and a name rebound to
127.0.0.1 with Chromium's host resolver rules). The server keeps serving throughout."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serving
from tests.support.browser import chromium, until

pytestmark = pytest.mark.slow
ALLOWED = "llmrun.test"  # the operator's --allowed-host


@pytest.fixture(scope="module")
def home(gemma_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hermetic home whose store holds Gemma (`gemma3:270m`), which a client may load on demand."""
    home = tmp_path_factory.mktemp("secure")
    store = home / "llmrun" / "models" / "embedded"
    store.mkdir(parents=True)
    for source in (gemma_cache, gemma_cache.with_name(gemma_cache.name + ".verified.json")):
        try:
            os.link(source, store / source.name)
        except OSError:
            shutil.copy2(source, store / source.name)
    return home


@pytest.fixture(scope="module")
def server(smollm: Path, minilm: Path, home: Path) -> Iterator[str]:
    args = ["-m", str(smollm), "-m", str(minilm), "--ctx", "1024", "--parallel", "1", "--allowed-host", ALLOWED]
    with serving.running(args, serving.hermetic_env(home)) as (url, process):
        yield url
        assert process.poll() is None, "the server died during the module"


@pytest.fixture(scope="module")
def chat_model(server: str) -> str:
    return next(n for n in httpx.get(server + "/v1/models").json()["data"] if n["id"].startswith("SmolLM2"))["id"]


def port(url: str) -> str:
    return url.rsplit(":", 1)[1]


# --- Host names: DNS rebinding ----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.nip.io:{port}", "0.0.0.0:{port}"])
def test_a_host_name_that_is_not_loopback_is_refused(server: str, host: str) -> None:
    for path in ("/v1/models", "/api/tags", "/health", "/"):
        response = httpx.get(server + path, headers={"Host": host.format(port=port(server))})
        assert response.status_code == 403, (path, response.text)
        assert "host name" in response.text
    assert httpx.get(server + "/api/tags", headers={"Host": "evil.example"}).json()["error"].startswith("this server")


@pytest.mark.parametrize("host", ["localhost:{port}", "127.0.0.1:{port}", "app.localhost:{port}", ALLOWED, "[::1]"])
def test_loopback_names_and_the_operators_are_answered(server: str, host: str) -> None:
    assert httpx.get(server + "/v1/models", headers={"Host": host.format(port=port(server))}).status_code == 200


# --- Origins: cross-site requests ------------------------------------------------------------------


def test_a_cross_site_post_is_refused_whatever_its_content_type(server: str, chat_model: str) -> None:
    body = json.dumps({"model": chat_model, "prompt": "Hi", "max_tokens": 1})
    for headers in (
        {"Origin": "http://evil.example", "Content-Type": "text/plain;charset=UTF-8"},  # no-cors: no preflight
        {"Origin": "http://127.0.0.1:1", "Content-Type": "application/json"},  # another local port
        {"Origin": "null", "Content-Type": "text/plain"},  # a sandboxed frame
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Content-Type": "text/plain"},
    ):
        response = httpx.post(server + "/v1/completions", content=body, headers=headers)
        assert response.status_code == 403, (headers, response.text)
        assert response.json()["error"]["code"] == "origin_not_allowed"
    ollama = httpx.post(server + "/api/generate", content=body, headers={"Origin": "http://evil.example"})
    assert ollama.status_code == 403 and "not allowed" in ollama.json()["error"]  # Ollama's shape
    preflight = httpx.options(
        server + "/v1/completions",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


def test_clients_that_are_not_browsers_work_as_before(server: str, chat_model: str) -> None:
    """curl -d as Ollama's and OpenAI's documentation write it (a form Content-Type, no Origin), the SDKs."""
    import ollama
    import openai

    body = json.dumps({"model": chat_model, "prompt": "Hi", "max_tokens": 2})
    curl = httpx.post(
        server + "/v1/completions", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert curl.status_code == 200, curl.text
    own = httpx.post(server + "/v1/completions", content=body, headers={"Origin": server})  # the page's own origin
    assert own.status_code == 200, own.text
    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0)
    assert client.completions.create(model=chat_model, prompt="Hi", max_tokens=2).usage is not None
    answer = ollama.Client(host=server).generate(model=chat_model, prompt="Hi", options={"num_predict": 2})
    assert answer.done


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def forbidden(server: str, endpoint: str) -> float:
    import re

    text = httpx.get(server + "/metrics").text
    found = re.search(
        rf'^llmrun_requests_total\{{endpoint="{re.escape(endpoint)}",status="403"\}} ([0-9.e+]+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def test_in_chromium_another_sites_page_cannot_use_the_server(server: str, chat_model: str, tmp_path: Path) -> None:
    """A page on another local port fetches the server every way a page can (no-cors text/plain POST, a CORS
    GET, a JSON POST): the server refuses each one (counted as 403 in its metrics), the page reads nothing.
    A name rebound to 127.0.0.1 (Chromium's host resolver rules) is refused too; the server's own page works."""
    (tmp_path / "index.html").write_text(
        f"""<!doctype html><title>elsewhere</title><pre id=out></pre><script>
const base = "{server}", out = document.getElementById("out"), say = (t) => out.textContent += t + "\\n";
(async () => {{
  try {{ await fetch(base + "/v1/completions", {{method: "POST", mode: "no-cors",
    body: JSON.stringify({{model: "{chat_model}", prompt: "pwned", max_tokens: 1}})}}); say("no-cors sent"); }}
  catch (e) {{ say("no-cors failed"); }}
  try {{ const r = await fetch(base + "/v1/models"); say("models read " + (await r.text()).length); }}
  catch (e) {{ say("models unreadable"); }}
  try {{ const r = await fetch(base + "/api/tags", {{method: "POST", headers: {{"Content-Type": "application/json"}},
    body: "{{}}"}}); say("tags read " + r.status); }} catch (e) {{ say("tags unreadable"); }}
  say("done");
}})();
</script>"""
    )
    other = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(tmp_path)))
    threading.Thread(target=other.serve_forever, daemon=True).start()
    before = {e: forbidden(server, e) for e in ("/v1/completions", "/v1/models")}
    rules = "--host-resolver-rules=MAP rebound.example 127.0.0.1"
    try:
        with chromium(width=800, height=600, extra=(rules,)) as driver:
            driver.get(f"http://127.0.0.1:{other.server_address[1]}/")
            text = until(lambda: "done" in (t := driver.find_element("id", "out").text) and t, "the probes' results")
            assert "models read" not in text and "tags read" not in text, text
            assert "models unreadable" in text and "tags unreadable" in text
            for endpoint in before:  # refused by the server itself, not only hidden by the browser
                until(lambda e=endpoint: forbidden(server, e) > before[e], f"a 403 on {endpoint}", timeout=10)
            driver.get(f"http://rebound.example:{port(server)}/v1/models")  # DNS rebinding, as the browser sees it
            assert "host name" in driver.find_element("tag name", "body").text
            assert chat_model not in driver.find_element("tag name", "body").text
            driver.get(server + "/")  # the server's own page: its own origin, answered
            until(lambda: driver.find_elements("css selector", "[data-testid=model] option"), "the model picker")
            driver.save_screenshot(str(tmp_path / "own-page.png"))
    finally:
        other.shutdown()


# --- nothing slow on the event loop ------------------------------------------------------------------


def sampled_health(server: str, work: Any) -> tuple[list[float], Any]:
    """/health's latencies, sampled every 20 ms while ``work()`` runs in another thread; and its result."""
    latencies: list[float] = []
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(work()))
    with httpx.Client(base_url=server, timeout=30) as client:
        client.get("/health")
        worker.start()
        while worker.is_alive():
            started = time.monotonic()
            assert client.get("/health").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.02)
    worker.join()
    return latencies, result[0]


def test_health_answers_while_a_huge_prompt_is_prepared(server: str, chat_model: str) -> None:
    """900,000 characters to render and tokenize (then refused: far over the context) in a worker thread."""
    huge = "All work and no play makes Jack a dull boy. " * 20_000
    body = {"model": chat_model, "messages": [{"role": "user", "content": huge}], "max_tokens": 1}
    latencies, response = sampled_health(
        server, lambda: httpx.post(server + "/v1/chat/completions", json=body, timeout=120)
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    print(
        f"/health during preparation: {len(latencies)} samples, median {statistics.median(latencies) * 1000:.1f} ms,"
        f" max {max(latencies) * 1000:.1f} ms"
    )
    assert len(latencies) >= 5
    assert statistics.median(latencies) < 0.1 and max(latencies) < 0.5


def test_health_answers_while_a_model_loads(server: str) -> None:
    body = {"model": "gemma3:270m", "prompt": "The capital of France is", "max_tokens": 1}
    latencies, response = sampled_health(server, lambda: httpx.post(server + "/v1/completions", json=body, timeout=120))
    assert response.status_code == 200, response.text
    print(f"/health during a load: {len(latencies)} samples, max {max(latencies) * 1000:.1f} ms")
    assert statistics.median(latencies) < 0.1 and max(latencies) < 0.5


def test_a_message_over_the_limit_is_a_413_naming_it(server: str, chat_model: str) -> None:
    huge = "x" * 3_000_000
    openai_like = httpx.post(
        server + "/v1/chat/completions",
        json={"model": chat_model, "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": huge}]},
    )
    assert openai_like.status_code == 413, openai_like.text
    error = openai_like.json()["error"]
    assert error["param"] == "messages[1]" and "1,000,000" in error["message"] and "template" not in error["message"]
    ollama_like = httpx.post(
        server + "/api/chat",
        json={"model": chat_model, "messages": [{"role": "user", "content": huge}], "stream": False},
    )
    assert ollama_like.status_code == 413 and "1,000,000" in ollama_like.json()["error"]


# --- one request cannot kill or starve the server -----------------------------------------------------


def test_token_ids_outside_the_vocabulary_are_a_400_and_the_server_lives(server: str) -> None:
    model = next(n["id"] for n in httpx.get(server + "/v1/models").json()["data"] if n["id"].startswith("minilm"))
    for ids in ([[2_000_000_000]], [[101, 30522, 102]]):
        response = httpx.post(server + "/v1/embeddings", json={"model": model, "input": ids})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] in ("input[0][0]", "input[0][1]")
        assert "vocabulary" in response.json()["error"]["message"]
    good = httpx.post(server + "/v1/embeddings", json={"model": model, "input": [[101, 7592, 102]]})
    assert good.status_code == 200 and len(good.json()["data"][0]["embedding"]) == 384


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"options": {"stop": [f"s{i}" for i in range(400)]}}, "at most 16"),
        ({"options": {"stop": ["x" * 5000]}}, "at most 1,000"),
        ({"messages": [{"role": "user", "content": "hi"}] * 1025}, "at most 1,024"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "function name"),
        ({"tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(129)]}, "1 to 128"),
        (
            {"tools": [{"type": "function", "function": {"name": "t", "parameters": {"d": "x" * 300_000}}}]},
            "at most 256,000",
        ),
    ],
)
def test_the_ollama_routes_have_the_openai_routes_limits(
    server: str, chat_model: str, body: dict[str, Any], expected: str
) -> None:
    sent = {"model": chat_model, "messages": [{"role": "user", "content": "hi"}], "stream": False, **body}
    response = httpx.post(server + "/api/chat", json=sent)
    assert response.status_code == 400, response.text
    assert expected in response.json()["error"]


def test_a_second_look_is_a_503_not_a_thread_waiting(server: str, chat_model: str) -> None:
    body = {"model": chat_model, "prompt": "The capital of France is Paris. " * 12}
    with httpx.Client(base_url=server, timeout=120) as client:
        results: list[httpx.Response] = []
        threads = [
            threading.Thread(target=lambda: results.append(client.post("/llmrun/look", json=body))) for _ in range(3)
        ]
        for thread in threads:
            thread.start()
            time.sleep(0.05)
        for thread in threads:
            thread.join()
    statuses = sorted(r.status_code for r in results)
    assert statuses[0] == 200 and 503 in statuses, statuses
    busy = next(r for r in results if r.status_code == 503)
    assert busy.headers["retry-after"] and busy.json()["error"]["code"] == "server_busy"


# --- what clients see --------------------------------------------------------------------------------


def test_models_given_by_path_are_served_by_file_name_and_no_body_shows_a_path(
    server: str, smollm: Path, chat_model: str
) -> None:
    ids = [n["id"] for n in httpx.get(server + "/v1/models").json()["data"]]
    assert smollm.name in ids and all("/" not in i for i in ids), ids
    assert smollm.name in [m["name"] for m in httpx.get(server + "/api/tags").json()["models"]]
    shown = httpx.post(server + "/api/show", json={"model": chat_model}).json()
    assert str(smollm.parent) not in str(shown) and shown["modelfile"] == f"FROM {smollm.name}\n"
    for response in (
        httpx.post(server + "/v1/completions", json={"model": "nothing-here", "prompt": "x"}),
        httpx.post(server + "/api/generate", json={"model": "nothing-here", "prompt": "x"}),
    ):
        assert response.status_code in (400, 404)
        assert str(smollm.parent) not in response.text and "/home" not in response.text and "/tmp" not in response.text
    by_path = httpx.post(server + "/v1/completions", json={"model": str(smollm), "prompt": "x", "max_tokens": 1})
    assert by_path.json()["model"] == smollm.name  # the operator's own path still names it; answers say its file name


def test_two_models_with_one_file_name_are_a_startup_error(smollm: Path, tmp_path: Path) -> None:
    from tests.support.helpers import invoke

    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / smollm.name).write_bytes(b"")
    code, _, err = invoke(["serve", "-m", str(smollm), "-m", str(other / smollm.name)])
    assert code != 0 and "two models would be served as" in err and str(other) in err


def test_connections_are_bounded_and_slow_headers_cut_off(smollm: Path, home: Path) -> None:
    """--max-connections: past it a request is a 503 at once; a client that sends its headers a byte at a time
    (slowloris) is disconnected after the header time limit, and the server answers others meanwhile."""
    import socket

    from llmrun.server.run import HEADER_TIMEOUT_S

    args = ["-m", str(smollm), "--ctx", "256", "--parallel", "1", "--max-connections", "3"]
    with serving.running(args, serving.hermetic_env(home)) as (url, _):
        host, port_number = "127.0.0.1", int(port(url))
        slow = socket.create_connection((host, port_number))
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        idle = [socket.create_connection((host, port_number)) for _ in range(2)]
        time.sleep(0.5)
        assert httpx.get(url + "/health").status_code == 503  # three connections open: the fourth is refused
        for connection in idle:
            connection.close()
        time.sleep(0.5)
        assert httpx.get(url + "/health").status_code == 200
        started = time.monotonic()
        slow.settimeout(HEADER_TIMEOUT_S + 5)
        closed = False
        while time.monotonic() - started < HEADER_TIMEOUT_S + 5:
            try:
                slow.sendall(b"X")  # a byte a second keeps a per-read timeout from ever firing
                if slow.recv(1, socket.MSG_DONTWAIT) == b"":
                    closed = True
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed = True
                break
            time.sleep(1)
        slow.close()
        assert closed and time.monotonic() - started <= HEADER_TIMEOUT_S + 2
