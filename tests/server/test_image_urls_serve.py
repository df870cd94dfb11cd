"""`llmrun serve --allow-image-urls` with the openai SDK: an http image URL answers as the same image sent as a
data URL; what the operator did not allow is a 400 in OpenAI's shape, and the server keeps serving. The image
server is on 127.0.0.1, allowed only because the operator names it (``--image-url-network 127.0.0.1/32``)."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import imagefiles, projector, serving
from tests.support.helpers import invoke

pytestmark = pytest.mark.slow
PROMPT = "Describe the picture."


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("image-urls")
    projector.write(folder / "mmproj.gguf")
    imagefiles.png(folder / "a.png", 64, 48, seed=1)
    return folder


@pytest.fixture(scope="module")
def images(folder: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def url(gemma_cache: Path, folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("serve"))
    args = ["-m", str(gemma_cache), "--mmproj", str(folder / "mmproj.gguf"), "--template", "gemma", "--ctx", "512"]
    args += ["--allow-image-urls", "--image-url-network", "127.0.0.1/32", "--image-url-timeout", "5"]
    with serving.running(args, env) as (address, _):
        yield address


def ask(url: str, image_url: str) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    content = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": PROMPT}]
    return client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item,misc]
        temperature=0,
        max_tokens=8,
    )


def test_an_image_url_answers_as_its_bytes_do(url: str, images: str, folder: Path) -> None:
    data = base64.b64encode((folder / "a.png").read_bytes()).decode()
    sent = ask(url, f"data:image/png;base64,{data}")
    fetched = ask(url, f"http://{images}/a.png")
    assert fetched.choices[0].message.content == sent.choices[0].message.content
    assert fetched.usage is not None and sent.usage is not None
    assert fetched.usage.prompt_tokens == sent.usage.prompt_tokens


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("http://127.0.0.2:{port}/a.png", "127.0.0.2, which this server does not fetch from"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254, which this server does not fetch from"),
        ("http://{images}/missing.png", "answered HTTP 404"),
        ("http://{images}/mmproj.gguf", "not an image this server reads"),
        ("file:///etc/passwd", "must be a data URL"),
    ],
)
def test_what_the_operator_did_not_allow_is_a_400(url: str, images: str, path: str, expected: str) -> None:
    image_url = path.format(images=images, port=images.rsplit(":", 1)[1])
    with pytest.raises(openai.BadRequestError) as caught:
        ask(url, image_url)
    error = caught.value.body
    assert isinstance(error, dict) and expected in error["message"]
    assert error["param"] == "messages[0].content[0].image_url"
    assert httpx.get(url + "/health", timeout=30).status_code == 200


def test_the_flags_are_checked_before_anything_loads() -> None:
    code, _, err = invoke(["serve", "-m", "gemma3:270m", "--image-url-network", "10.0.0.0/8"])
    assert code == 2 and "goes with --allow-image-urls" in err and "Traceback" not in err
    code, _, err = invoke(["serve", "-m", "gemma3:270m", "--allow-image-urls", "--image-url-network", "intranet"])
    assert code == 2 and "'intranet' is not an IP network" in err
