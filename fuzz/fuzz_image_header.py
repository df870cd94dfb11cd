"""Image headers (PNG, JPEG, GIF, BMP; WebP and others refused), read before libmtmd decodes an image
given to `llmrun run --image` (llmrun.formats.image.sniff: format, size and pixel limits)."""

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.formats.image import sniff


def one(data: bytes) -> None:
    sniff(data)


if __name__ == "__main__":
    harness.main(one)
