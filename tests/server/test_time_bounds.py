"""The server bounds each request: `serve --max-tokens` (the longest answer, and the default) and
`--request-timeout` (wall clock per request), against a real `llmrun serve` on SmolLM2 with room for
long answers. The bodies are the ones schemathesis once found answering only when the context was
full: legal but pathological sampling values, a large max_tokens, an empty prompt."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serving

pytestmark = pytest.mark.slow
TIMEOUT_S = 3.0  # the server's --request-timeout
CEILING = 1024  # the server's --max-tokens: at SmolLM2's speed here, far more than 3 s of decoding
SLACK_S = 4.0  # loading nothing, tokenizing, the HTTP round trip, a slow machine
TINY = 5e-324  # the smallest positive double
COUNTING = "1, 2, 3, 4, 5,"  # SmolLM2 counts on, greedily, far past the time limit


@pytest.fixture(scope="module")
def url(smollm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("bounded"))
    args = ["-m", str(smollm), "--ctx", "2048", "--parallel", "1"]
    args += ["--request-timeout", str(TIMEOUT_S), "--max-tokens", str(CEILING)]
    with serving.running(args, env) as (address, _):
        yield address


def timed_out(url: str) -> float:
    found = re.search(r"^llmrun_requests_timed_out_total ([0-9.e+]+)$", httpx.get(url + "/metrics").text, re.M)
    assert found is not None
    return float(found.group(1))


def post(url: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(url + path, json=body, timeout=30)
    return response, time.monotonic() - started


PATHOLOGICAL = [
    ("/v1/completions", {"prompt": "Once upon a time", "repeat_penalty": TINY, "max_tokens": CEILING}),
    ("/v1/completions", {"prompt": "Once upon a time", "top_p": TINY, "max_tokens": CEILING}),
    ("/v1/completions", {"prompt": "", "max_tokens": CEILING, "temperature": 1.5}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to ten thousand."}], "top_p": TINY}),
    ("/api/generate", {"prompt": "Once upon a time", "stream": False, "options": {"repeat_penalty": TINY}}),
    (
        "/api/chat",
        {"messages": [{"role": "user", "content": "Go on forever."}], "stream": False, "options": {"top_p": TINY}},
    ),
]


@pytest.mark.parametrize(("path", "body"), PATHOLOGICAL, ids=[f"{p} {sorted(b)}" for p, b in PATHOLOGICAL])
def test_a_pathological_request_answers_within_the_time_limit(url: str, path: str, body: dict[str, Any]) -> None:
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    response, elapsed = post(url, path, {"model": model, **body})
    assert elapsed < TIMEOUT_S + SLACK_S, (elapsed, response.text[:300])
    if path.startswith("/v1/"):
        if response.status_code == 400:  # an empty prompt has no tokens: refused at once, in OpenAI's shape
            assert response.json()["error"]["param"] == "prompt"
            return
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] in ("length", "stop")
        assert response.json()["usage"]["completion_tokens"] <= CEILING
    else:
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["done"] is True and answer["done_reason"] in ("length", "stop")
        assert answer["eval_count"] <= CEILING


def test_the_time_limit_ends_a_long_answer_with_what_it_has_and_is_counted(url: str) -> None:
    before = timed_out(url)
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    body = {
        "model": model,
        "prompt": COUNTING,
        "max_tokens": CEILING,
        "temperature": 0,
        "stream": True,
    }
    started = time.monotonic()
    text, finish = [], None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text.append(choice["text"])
                finish = choice["finish_reason"] or finish
    elapsed = time.monotonic() - started
    assert TIMEOUT_S - 0.5 < elapsed < TIMEOUT_S + SLACK_S, elapsed
    assert finish == "length" and "".join(text)  # the answer so far, ended as a limit ends it
    assert timed_out(url) == before + 1


def test_above_the_ceiling_is_a_400_naming_the_field(url: str) -> None:
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    response, _ = post(url, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": CEILING + 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    response, _ = post(
        url, "/api/generate", {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": CEILING + 1}}
    )
    assert response.status_code == 400 and "num_predict" in response.json()["error"]
    limits = httpx.get(url + "/openapi.json").json()["info"]["x-llmrun-limits"]
    assert limits == {"max_tokens": CEILING, "request_timeout_s": TIMEOUT_S}


def test_a_client_that_gives_up_on_a_non_streaming_answer_frees_its_slot(url: str) -> None:
    """The client's own timeout (1 s) ends the connection while tokens are still arriving; the slot is
    free again long before the server's time limit would have freed it."""
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": COUNTING, "max_tokens": CEILING, "temperature": 0}
    gave_up = threading.Event()

    def impatient() -> None:
        try:
            httpx.post(url + "/v1/completions", json=body, timeout=1.0)
        except httpx.TimeoutException:
            gave_up.set()

    started = time.monotonic()
    client = threading.Thread(target=impatient)
    client.start()
    client.join()
    assert gave_up.is_set()
    while httpx.get(url + "/health").json()["slots"]["busy"]:
        assert time.monotonic() - started < TIMEOUT_S - 0.5, "the slot was freed by the time limit, not the disconnect"
        time.sleep(0.05)
