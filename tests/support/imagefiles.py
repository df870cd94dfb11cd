"""Small image files built byte by byte (zlib and struct, no imaging library): whole PNGs of random
pixels for the model, and headers of every kind for the header reader and its fuzz seeds."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """An RGB PNG of random pixels."""
    import numpy as np

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\0" + row.tobytes() for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def png(path: Path, width: int = 64, height: int = 48, seed: int = 0) -> Path:
    path.write_bytes(png_bytes(width, height, seed))
    return path


def png_header(width: int, height: int) -> bytes:
    """A PNG's signature and header chunk, no pixels: what a decompression bomb starts with."""
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


def jpeg_header(width: int, height: int) -> bytes:
    """Start of image, an APP0 segment, then a baseline start-of-frame with the size."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\0\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + app0 + sof


def gif_header(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0)


def bmp_header(width: int, height: int) -> bytes:
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54 + 3 * width * abs(height), 0, 0, 54) + info


def webp_header() -> bytes:
    return b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8 " + b"\0" * 18


def headers() -> dict[str, bytes]:
    """One of each, for the fuzz seeds."""
    return {
        "png": png_bytes(4, 3),
        "png-bomb": png_header(20_000, 20_000),
        "jpeg": jpeg_header(640, 480),
        "gif": gif_header(32, 16),
        "bmp": bmp_header(8, -8),
        "webp": webp_header(),
        "text": b"hello, this is not an image\n",
    }


def bmp_bytes(width: int, height: int) -> bytes:
    """A whole 24-bit BMP (bottom-up rows, each padded to four bytes) of a gradient."""
    pad = b"\0" * (-3 * width % 4)
    pixels = b"".join(bytes((x * 37 + y * 13) % 256 for x in range(3 * width)) + pad for y in range(height))
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54 + len(pixels), 0, 0, 54) + info + pixels


GIF_1X1 = bytes.fromhex("47494638396101000100800000ffffff0000002c00000000010001000002024401003b")
"""A whole 1 × 1 GIF (one white pixel)."""


def decodable() -> dict[str, bytes]:
    """Whole images of the formats written here, and damaged ones, for the decoder's fuzz seeds."""
    whole = png_bytes(8, 6, seed=3)
    return {
        "png": whole,
        "png-truncated": whole[: len(whole) // 2],
        "png-short-data": png_header(64, 64) + _chunk(b"IDAT", zlib.compress(b"\0" * 10)) + _chunk(b"IEND", b""),
        "bmp": bmp_bytes(5, 3),
        "bmp-truncated": bmp_bytes(5, 3)[:70],
        "gif": GIF_1X1,
        "jpeg-header-only": jpeg_header(16, 16),
    }
