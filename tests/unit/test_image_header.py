"""The image header reader (llmrun.formats.image): format and size from the first bytes, limits first."""

from __future__ import annotations

import pytest

from llmrun.formats import image
from llmrun.formats.image import ImageError, ImageInfo, sniff
from tests.support import imagefiles


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (imagefiles.png_bytes(5, 3), ImageInfo("png", 5, 3)),
        (imagefiles.jpeg_header(640, 480), ImageInfo("jpeg", 640, 480)),
        (imagefiles.gif_header(32, 16), ImageInfo("gif", 32, 16)),
        (imagefiles.bmp_header(8, -6), ImageInfo("bmp", 8, 6)),  # a top-down bitmap
    ],
)
def test_each_format_gives_its_size(data: bytes, expected: ImageInfo) -> None:
    assert sniff(data) == expected


def test_a_jpeg_size_is_found_after_other_segments_and_fill_bytes() -> None:
    head = imagefiles.jpeg_header(300, 200)
    exif = b"\xff\xe1" + (2 + 40).to_bytes(2, "big") + b"E" * 40
    assert sniff(head[:2] + exif + b"\xff" + head[2:]) == ImageInfo("jpeg", 300, 200)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "is empty"),
        (b"hello, not an image", "is not a PNG, JPEG, GIF or BMP image"),
        (imagefiles.webp_header(), "is a WebP image"),
        (imagefiles.png_header(20_000, 20_000), "declares 20000 × 20000 pixels"),
        (imagefiles.png_header(0, 10), "declares a size of 0 × 10"),
        (imagefiles.png_bytes(4, 4)[:20], "is not a PNG"),  # cut inside its header
        (b"\xff\xd8\xff\xda\x00\x02", "is not a PNG"),  # a scan before any frame
    ],
)
def test_what_is_refused_is_one_line(data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message) as caught:
        sniff(data, "cat.png")
    assert caught.value.message.startswith("cat.png ") and "\n" not in caught.value.message
    assert caught.value.exit_code == 2


def test_bytes_over_the_limit_are_refused_before_reading_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "MAX_IMAGE_BYTES", 100)
    with pytest.raises(ImageError, match="over llmrun's limit of 0 MB"):
        sniff(imagefiles.png_bytes(16, 16))
