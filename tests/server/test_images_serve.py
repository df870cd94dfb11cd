"""Images through a real `llmrun serve` (the packaged Gemma with the tests' random-weight projector, Gemma's
chat template) and the clients people use: the openai SDK with ``image_url`` data URLs, the ollama library
with ``images``. The answers equal `llmrun run --image`'s; what the server must not take is a 400 in the
API's own shape, and the server keeps serving."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import imagefiles, projector, serving
from tests.support.helpers import invoke

pytestmark = pytest.mark.slow
PROMPT = "Describe the picture."


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("images-serve")
    return projector.write(folder / "mmproj.gguf"), imagefiles.png(folder / "a.png", 64, 48, seed=1)


@pytest.fixture(scope="module")
def url(gemma_cache: Path, files: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = serving.hermetic_env(tmp_path_factory.mktemp("serve"))
    args = ["-m", str(gemma_cache), "-m", "smollm2:135m", "--mmproj", str(files[0]), "--template", "gemma"]
    with serving.running([*args, "--parallel", "2", "--ctx", "512"], env) as (address, _):
        yield address


def data_url(path: Path, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def image_message(url: str) -> list[dict[str, object]]:
    return [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": PROMPT}],
        }
    ]


def test_openai_image_url_parts_give_the_cli_answer(
    url: str, gemma: Path, gemma_cache: Path, files: tuple[Path, Path]
) -> None:
    mmproj, image = files
    args = ["run", "-m", "gemma3:270m", "--mmproj", str(mmproj), "--image", str(image), "--template", "gemma"]
    code, out, err = invoke([*args, "-t", "0", "-n", "8", "--ctx", "512", "--show-special", "--json", PROMPT])
    assert code == 0, err
    expected = json.loads(out)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    answer = client.chat.completions.create(
        model=model,
        messages=image_message(data_url(image)),
        temperature=0,
        max_tokens=8,  # type: ignore[arg-type]
    )
    assert answer.choices[0].message.content == expected["text"]
    assert answer.usage is not None and answer.usage.prompt_tokens == expected["tokens"]["prompt"]
    stream = client.chat.completions.create(
        model=model,
        messages=image_message(data_url(image)),  # type: ignore[arg-type]
        temperature=0,
        max_tokens=8,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected["text"]


def test_ollama_images_give_the_same_answer(url: str, files: tuple[Path, Path]) -> None:
    import ollama

    client = ollama.Client(host=url)
    model = openai.OpenAI(base_url=url + "/v1", api_key="none").models.list().data[0].id
    message = {"role": "user", "content": PROMPT, "images": [files[1].read_bytes()]}
    chat = client.chat(model=model, messages=[message], options={"temperature": 0, "num_predict": 8})
    answer = openai.OpenAI(base_url=url + "/v1", api_key="none").chat.completions.create(
        model=model,
        messages=image_message(data_url(files[1])),
        temperature=0,
        max_tokens=8,  # type: ignore[arg-type]
    )
    assert chat.message.content == answer.choices[0].message.content
    generated = client.generate(model=model, prompt=PROMPT, images=[files[1].read_bytes()], options={"num_predict": 4})
    assert generated.response is not None
    assert "vision" in (client.show(model).capabilities or [])  # as Ollama says of a vision model
    assert "vision" not in (client.show("smollm2:135m").capabilities or [])


@pytest.mark.parametrize(
    ("image_url", "expected"),
    [
        ("http://127.0.0.1:9/cat.png", "not fetched by this server"),
        ("https://example.com/cat.png", "not fetched by this server"),
        ("file:///etc/passwd", "must be a data URL"),
        ("data:text/plain;base64,aGVsbG8=", "not an image type"),
        ("data:image/png;base64,not base64!", "not valid base64"),
        ("data:image/png;base64," + base64.b64encode(b"hello, not a png").decode(), "is not a PNG"),
        ("data:image/png;base64," + base64.b64encode(imagefiles.png_header(20_000, 20_000)).decode(), "20000 × 20000"),
        ("data:image/webp;base64,UklGRg==", "not an image type"),
    ],
)
def test_what_the_server_does_not_take_is_a_400(url: str, image_url: str, expected: str) -> None:
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    answer = httpx.post(
        url + "/v1/chat/completions",
        json={"model": model, "messages": image_message(image_url), "max_tokens": 2},
        timeout=60,
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert expected in error["message"] and error["param"].startswith("messages[0].content[0]")
    assert httpx.get(url + "/health", timeout=30).status_code == 200


def test_images_for_a_model_without_a_projector_and_in_other_roles_are_refused(
    url: str, files: tuple[Path, Path]
) -> None:
    image = data_url(files[1])
    answer = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "smollm2:135m", "messages": image_message(image), "max_tokens": 2},
        timeout=60,
    )
    assert answer.status_code == 400 and "does not see images" in answer.json()["error"]["message"]
    ollama = httpx.post(
        url + "/api/chat",
        json={"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]},
        timeout=60,
    )
    assert ollama.status_code == 400 and "error" in ollama.json()
    system = [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": image}}]}]
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    refused = httpx.post(url + "/v1/chat/completions", json={"model": model, "messages": system}, timeout=60)
    assert refused.status_code == 400 and "images go in user messages" in refused.json()["error"]["message"]
