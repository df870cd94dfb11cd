"""What the GGUF (libmtmd) and MLX (mlx-vlm) image paths share: the keys an image's positions are held by
in the context, the names images go by in errors, the refusal of a prompt that does not fit, and the image
figures a finished generation reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Protocol

from llmrun.decoding.events import Done, Token
from llmrun.errors import ContextFull


class Encoder(Protocol):
    """A projector that keeps the images it encoded: seconds spent encoding, images met again."""

    encode_seconds: float
    hits: int


def image_keys(digest: str, positions: int) -> list[int]:
    """The keys an image's positions are remembered by in the context: negative (no token is), from its hash,
    so a prompt that repeats an image reuses its cells and a different image does not."""
    base = int(digest[:8], 16)
    return [-(1 + (base + k) % (2**31 - 2)) for k in range(positions)]


def image_names(count: int) -> list[str]:
    """How errors name each of ``count`` images."""
    return [f"image {n}" if count > 1 else "the image" for n in range(1, count + 1)]


def too_long(positions: int, image_positions: int, images: int, n_ctx: int, hint: str) -> ContextFull:
    """The refusal of a prompt with images over the context, before anything is evaluated."""
    return ContextFull(
        f"the prompt takes {positions} positions ({image_positions} of them for {images} "
        f"image{'s' if images > 1 else ''}), more than the context of {n_ctx}",
        hint,
    )


def snapshot(encoder: Encoder) -> tuple[float, int]:
    """The encoder's figures now, to count a generation's share from."""
    return encoder.encode_seconds, encoder.hits


def counted(
    events: Iterator[Token | Done], encoder: Encoder, image_positions: int, before: tuple[float, int]
) -> Iterator[Token | Done]:
    """``events`` with the image figures in the final stats: positions, and the encoding seconds and images
    reused since ``before`` (:func:`snapshot`, taken when the generation began)."""
    for event in events:
        if isinstance(event, Done):
            stats = dataclasses.replace(
                event.stats,
                image_tokens=image_positions,
                image_seconds=encoder.encode_seconds - before[0],
                images_reused=encoder.hits - before[1],
            )
            event = Done(event.text, stats)
        yield event
