"""Images as the APIs carry them (pure): OpenAI's image_url data URLs and Ollama's base64 images."""

from __future__ import annotations

import base64

import pytest

from llmrun.api import ollama
from llmrun.api import openai as api
from llmrun.api.errors import ApiError
from llmrun.api.images import BadImage, from_base64, from_url
from llmrun.decoding.sampling import SamplingParams
from tests.support import imagefiles

PNG = imagefiles.png_bytes(4, 3)
B64 = base64.b64encode(PNG).decode()


def test_a_data_url_gives_the_image_bytes() -> None:
    assert from_url(f"data:image/png;base64,{B64}") == PNG
    assert from_url(f"data:IMAGE/JPEG;base64,{base64.b64encode(imagefiles.jpeg_header(8, 8)).decode()}")
    assert from_base64(B64) == PNG


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://example.com/a.png", "not fetched"),
        ("file:///etc/passwd", "must be a data URL"),
        ("ftp://x/y.png", "must be a data URL"),
        ("/etc/passwd", "must be a data URL"),
        (f"data:image/svg+xml;base64,{B64}", r"image/svg\+xml is not an image type"),
        (f"data:image/png,{B64}", "must be base64"),
        ("data:image/png;base64,@@@", "not valid base64"),
        (f"data:image/png;base64,{base64.b64encode(b'GIF89a').decode()}", "is not a PNG"),
    ],
)
def test_what_is_not_an_image_in_bytes_is_refused(url: str, message: str) -> None:
    with pytest.raises(BadImage, match=message):
        from_url(url)


def test_openai_messages_carry_a_user_turns_images_and_refuse_them_elsewhere() -> None:
    limits = api.Limits(max_tokens=64)
    content = [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}},
    ]
    (message,) = api.parse_messages([{"role": "user", "content": content}], limits)
    assert message.content == "What is it?" and message.images == (PNG,)
    with pytest.raises(ApiError, match="images go in user messages"):
        api.parse_messages([{"role": "system", "content": content}], limits)
    with pytest.raises(ApiError, match="not fetched") as caught:
        api.parse_messages(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}], limits
        )
    assert caught.value.status == 400 and caught.value.param == "messages[0].content[0].image_url"


def test_ollama_images_are_base64_of_images() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi", "images": [B64]}]}
    call = ollama.parse_chat(body, SamplingParams())
    assert call.request.messages[0].images == (PNG,)
    generate = ollama.parse_generate({"model": "m", "prompt": "hi", "images": [B64]}, SamplingParams())
    assert generate.request.images == (PNG,)
    for images, message in (
        ("x", "array of base64"),
        (["@@"], "not valid base64"),
        ([base64.b64encode(b"no").decode()], "is not a PNG"),
    ):
        with pytest.raises(ApiError, match=message):
            ollama.parse_generate({"model": "m", "prompt": "hi", "images": images}, SamplingParams())
    assistant = {"model": "m", "messages": [{"role": "assistant", "content": "", "images": [B64]}]}
    with pytest.raises(ApiError, match="images go in user messages"):
        ollama.parse_chat(assistant, SamplingParams())
