"""Images named on the command line (``--image PATH``, ``-`` for stdin's bytes), read and checked before
anything loads: a missing file, an oversized one or one that is not an image is one line."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from llmrun.errors import UsageError
from llmrun.formats.image import MAX_IMAGE_BYTES, ImageError, sniff


def read_images(paths: Sequence[Path], prompt: str | None) -> tuple[bytes, ...]:
    """The images' bytes, in order; ``prompt`` is the prompt argument (stdin cannot be both)."""
    images = []
    for path in paths:
        name = str(path)
        if name == "-":
            if prompt is None or prompt == "-":
                raise UsageError(
                    "--image - reads the image from stdin, so the prompt cannot come from it too",
                    'give the prompt as an argument: llmrun run --image - "What is this?" < cat.png',
                )
            data = sys.stdin.buffer.read(MAX_IMAGE_BYTES + 1)
            name = "the image on stdin"
        else:
            if not path.is_file():
                what = "is a folder" if path.is_dir() else "does not exist"
                raise UsageError(f"the image {path} {what}", "give an image file's path")
            if path.stat().st_size > MAX_IMAGE_BYTES:
                raise ImageError(
                    f"{path} is {path.stat().st_size / 2**20:.1f} MB, over llmrun's limit of "
                    f"{MAX_IMAGE_BYTES // 2**20} MB",
                    "make it smaller first (the model sees it at its projector's resolution anyway)",
                )
            data = path.read_bytes()
            name = str(path)
        sniff(data, name)
        images.append(data)
    return tuple(images)
