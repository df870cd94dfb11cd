"""What an image is before anything decodes it: its format and size, read from its first bytes.

An image reaches llmrun as bytes from a user (a file, stdin, a data URL, Ollama's base64). Before
libmtmd decodes it, llmrun checks what the bytes claim: a format libmtmd reads (PNG, JPEG, GIF,
BMP), a byte size under a limit, and pixel dimensions under a limit, so that a 20,000 × 20,000
header (a decompression bomb: a few kilobytes that ask for gigabytes) is one clear error instead of
a 1.6 GB allocation. The header readers are bounded and total: any byte string gives an
:class:`ImageInfo` or an :class:`ImageError`, never another exception (fuzzed: ``fuzz/image_header.py``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from llmrun.errors import UsageError

MAX_IMAGE_BYTES = 32 * 2**20  # a photo from a phone is 2-12 MB
MAX_PIXELS = 64_000_000  # 8000 × 8000: decoding it takes 256 MB as RGBA
FORMATS = "PNG, JPEG, GIF or BMP"


class ImageError(UsageError):
    """An image llmrun will not pass on: not one it reads, too large, or damaged."""


@dataclass(frozen=True)
class ImageInfo:
    format: str  # "png", "jpeg", "gif", "bmp"
    width: int
    height: int


def sniff(data: bytes, name: str = "the image") -> ImageInfo:
    """The format and dimensions ``data`` declares; :class:`ImageError` for anything else."""
    if not data:
        raise ImageError(f"{name} is empty", f"give a {FORMATS} file")
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(
            f"{name} is {len(data) / 2**20:.1f} MB, over llmrun's limit of {MAX_IMAGE_BYTES // 2**20} MB",
            "make it smaller first (the model sees it at its projector's resolution anyway)",
        )
    info = _read(data)
    if info is None:
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            raise ImageError(f"{name} is a WebP image, which llama.cpp's image decoder does not read", _convert())
        if data[:12] in (b"\0\0\0\x0cjP  \r\n\x87\n",) or data[4:12] in (b"ftypheic", b"ftypavif", b"ftypmif1"):
            raise ImageError(f"{name} is in a format llama.cpp's image decoder does not read", _convert())
        raise ImageError(f"{name} is not a {FORMATS} image (or its header is damaged)", _convert())
    if info.width <= 0 or info.height <= 0:
        raise ImageError(f"{name} declares a size of {info.width} × {info.height}", "the file is damaged")
    if info.width * info.height > MAX_PIXELS:
        raise ImageError(
            f"{name} declares {info.width} × {info.height} pixels, over llmrun's limit of "
            f"{MAX_PIXELS // 1_000_000} million",
            "scale it down first (the model sees it at its projector's resolution anyway)",
        )
    return info


def _convert() -> str:
    return f"convert it to {FORMATS} first"


def _read(data: bytes) -> ImageInfo | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return _png(data)
    if data[:3] == b"\xff\xd8\xff":
        return _jpeg(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data)
    if data[:2] == b"BM":
        return _bmp(data)
    return None


def _png(data: bytes) -> ImageInfo | None:
    # the first chunk is IHDR: length 13, then width and height as big-endian 32-bit
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return ImageInfo("png", width, height)


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes) -> ImageInfo | None:
    # markers from the start of image to the first start-of-frame, which holds the size
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if length < 2:
            return None
        if marker in _SOF:
            if at + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return ImageInfo("jpeg", width, height)
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame
            return None
        at += 2 + length
    return None


def _gif(data: bytes) -> ImageInfo | None:
    if len(data) < 10:
        return None
    width, height = struct.unpack("<HH", data[6:10])
    return ImageInfo("gif", width, height)


def _bmp(data: bytes) -> ImageInfo | None:
    if len(data) < 26:
        return None
    (header,) = struct.unpack("<I", data[14:18])
    if header == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        width, height = struct.unpack("<HH", data[18:22])
        return ImageInfo("bmp", width, height)
    if header < 40:
        return None
    width, height = struct.unpack("<ii", data[18:26])
    return ImageInfo("bmp", width, abs(height))  # a negative height is a top-down bitmap
