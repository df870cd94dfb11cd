"""Images as the APIs carry them: OpenAI's ``image_url`` data URLs and Ollama's base64 ``images`` (pure).

A client-supplied image is bytes in the request: a data URL with an image MIME type llama.cpp decodes,
or base64. Nothing here fetches a URL: ``http(s)`` URLs reach this parser only when the server does not
fetch them (it does only with ``serve --allow-image-urls``: ``llmrun/server/image_urls.py`` turns them into
data URLs first, under its address, size and time limits); ``file://`` and every other scheme never, so a
request cannot make the server read its own files.
"""

from __future__ import annotations

import base64
import binascii
import re

from llmrun.formats.image import ImageError, sniff

MIME_TYPES = {"image/png", "image/jpeg", "image/jpg", "image/gif", "image/bmp", "image/x-ms-bmp"}
_DATA_URL = re.compile(r"data:(?P<mime>[^;,]*)(?P<params>(;[^;,]*)*),(?P<data>.*)", re.DOTALL)


class BadImage(ValueError):
    """An image part the server does not take; the message says why (the API answers 400 with it)."""


def from_url(url: str) -> bytes:
    """An ``image_url``'s image: a base64 data URL of a PNG, JPEG, GIF or BMP."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme in ("http", "https"):
            raise BadImage(
                "image URLs are not fetched by this server (unless started as llmrun serve --allow-image-urls): send "
                "the image as a data URL (data:image/png;base64,…)"
            )
        raise BadImage("an image_url must be a data URL (data:image/png;base64,…)")
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise BadImage("the data URL is malformed")
    mime = match["mime"].strip().lower()
    if mime not in MIME_TYPES:
        raise BadImage(
            f"the data URL's type {mime or '(none)'} is not an image type this server reads (PNG, JPEG, GIF, BMP)"
        )
    if ";base64" not in match["params"].lower():
        raise BadImage("the data URL must be base64 (data:image/png;base64,…)")
    return from_base64(match["data"])


def from_base64(text: str) -> bytes:
    """Ollama's ``images`` entry (or a data URL's payload): base64 of a PNG, JPEG, GIF or BMP file."""
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise BadImage("the image is not valid base64") from None
    try:
        sniff(data)
    except ImageError as exc:
        raise BadImage(exc.message) from None
    return data
