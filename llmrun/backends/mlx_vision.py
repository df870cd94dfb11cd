"""Images on MLX: mlx-vlm's vision tower and projector beside mlx-lm's text model.

An MLX vision model is one directory (mlx-community's layout: ``language_model.*``, ``vision_tower.*`` and
``multi_modal_projector.*`` weights, a processor). mlx-lm already loads its text half; here mlx-vlm loads the
rest lazily — its vision tower and projector are read, its own copy of the text model never is (it is
swapped for mlx-lm's before anything is evaluated) — and its processor turns an image into the tokens it
takes (Gemma 3: ``\\n\\n<start_of_image>``, 256 image tokens, ``<end_of_image>\\n\\n``) and its pixels. The
span's embeddings (the text model's for its text, the projector's for the image) are computed once per
image, kept by content hash, and handed to mlx-lm's ``generate_step`` as ``input_embeddings``: the answer is
then sampled by llmrun's own loop as any other. Gemma 3 vision models only for now; mlx-vlm is the optional
``mlx-vision`` extra, imported on the first image.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.backends.images import counted, image_keys, image_names, snapshot, too_long
from llmrun.decoding.events import Done, Token
from llmrun.errors import BackendError, UsageError
from llmrun.formats.image import ImageError, sniff
from llmrun.formats.mlx_header import describes_vision

if TYPE_CHECKING:
    from llmrun.decoding.sampling import SamplingParams
    from llmrun.structured.grammar import Constraint

SUPPORTED = ("gemma3",)
KEPT = 16  # image encodings kept per model (by content hash)


@dataclass(frozen=True)
class VisionSpan:
    """An image as the model reads it: its token ids (image tokens and the text around them), their
    embeddings, and the keys that stand for its positions in the context (derived from its sha256)."""

    ids: tuple[int, ...]
    embeddings: Any  # mx.array (positions, width)
    keys: tuple[int, ...]

    @property
    def positions(self) -> int:
        return len(self.ids)


def _processor(path: Path, tokenizer: Any, config: dict[str, Any]) -> Any:
    """Gemma 3's processor (mlx-vlm's), on the tokenizer the text model already read (reading Gemma's 33 MB
    tokenizer.json again would take seconds) and the directory's image processor."""
    import json

    from mlx_vlm.models.gemma3.processing_gemma3 import Gemma3Processor
    from transformers import AutoImageProcessor

    settings = path / "processor_config.json"
    given = json.loads(settings.read_text(encoding="utf-8")) if settings.is_file() else {}
    length = given.get("image_seq_length") or config.get("mm_tokens_per_image") or 256
    image_processor = AutoImageProcessor.from_pretrained(path)
    return Gemma3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_length=int(length))


class MlxVision:
    """The vision half of an MLX vision model, loaded on the first image."""

    def __init__(self, path: Path, text_model: Any, tokenizer: Any, config: dict[str, Any]) -> None:
        kind = config.get("model_type")
        if kind not in SUPPORTED:
            raise UsageError(
                f"llmrun reads images on MLX for Gemma 3 vision models; {path.name} is {kind}",
                "run the model's GGUF with its projector (mmproj)",
            )
        try:
            from mlx_vlm.utils import load_model
        except ImportError:
            raise UsageError(
                "reading images with an MLX model needs mlx-vlm", "pip install 'llmrun[mlx-vision]'"
            ) from None
        try:
            vlm = load_model(path, lazy=True)
            processor = _processor(path, tokenizer, config)
        except (ValueError, OSError, KeyError, AttributeError) as exc:
            raise BackendError(f"mlx-vlm could not load the vision half of {path.name}: {exc}", "try `debug`") from exc
        vlm.language_model = text_model.language_model  # its own text model was never read: mlx-lm's is used
        self.vlm = vlm
        self.processor = processor
        self.placeholder: str = getattr(processor, "boi_token", None) or processor.image_token
        self._spans: OrderedDict[str, VisionSpan] = OrderedDict()
        self.encode_seconds = 0.0
        self.hits = 0

    def text_embeddings(self, ids: list[int]) -> Any:
        import mlx.core as mx

        return self.vlm.get_input_embeddings(mx.array([ids])).inputs_embeds[0]

    def span(self, data: bytes, name: str = "the image") -> VisionSpan:
        """The image's span (encoded once per content)."""
        import io

        import mlx.core as mx

        sniff(data, name)
        digest = hashlib.sha256(data).hexdigest()
        kept = self._spans.get(digest)
        if kept is not None:
            self._spans.move_to_end(digest)
            self.hits += 1
            return kept
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as opened:
                image = opened.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise ImageError(f"{name} could not be decoded: {exc}", "check that the file is whole") from None
        started = time.perf_counter()
        inputs = self.processor(text=[self.placeholder], images=[image], add_special_tokens=False)
        ids = [int(i) for i in inputs["input_ids"][0].tolist()]
        embeddings = self.vlm.get_input_embeddings(
            inputs["input_ids"], inputs["pixel_values"], mask=inputs["attention_mask"]
        ).inputs_embeds[0]
        mx.eval(embeddings)
        self.encode_seconds += time.perf_counter() - started
        span = VisionSpan(tuple(ids), embeddings, tuple(image_keys(digest, len(ids))))
        self._spans[digest] = span
        while len(self._spans) > KEPT:
            self._spans.popitem(last=False)
        return span


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt with images as mlx-lm evaluates it: every position's token id (an image's own tokens
    included), the keys the cache is said to hold for them, and their input embeddings."""

    ids: list[int]
    keys: list[int]
    embeddings: Any  # mx.array (positions, width)
    image_positions: int


def image_prompt(vision: MlxVision, ids: Sequence[int], at: Sequence[int], images: Sequence[bytes]) -> ImagePrompt:
    """``ids`` with ``images[i]`` put before token ``at[i]``."""
    import mlx.core as mx

    spans = [vision.span(data, name) for data, name in zip(images, image_names(len(images)), strict=True)]
    full: list[int] = []
    keys: list[int] = []
    pieces: list[Any] = []
    cut = 0
    for where, span in zip(at, spans, strict=True):
        text = list(ids[cut:where])
        full += [*text, *span.ids]
        keys += [*text, *span.keys]
        pieces += ([vision.text_embeddings(text)] if text else []) + [span.embeddings]
        cut = where
    rest = list(ids[cut:])
    full += rest
    keys += rest
    pieces += [vision.text_embeddings(rest)] if rest else []
    return ImagePrompt(full, keys, mx.concatenate(pieces, axis=0), sum(s.positions for s in spans))


class MlxImages:
    """The image side of :class:`llmrun.backends.mlx.MlxModel` (:class:`llmrun.backends.base.SeesImages`)."""

    path: Path
    config: dict[str, Any]
    model: Any
    tokenizer: Any
    n_ctx: int
    reused: int
    _cache: list[Any] | None
    _vision_path: Path | None
    _vision: MlxVision | None

    if TYPE_CHECKING:  # MlxModel's

        def reset(self) -> None: ...

        def _prepare(self, ids: Sequence[int]) -> int: ...

        def _sample(
            self,
            ids: list[int],
            held: list[int],
            start: int,
            params: SamplingParams,
            seed: int | None,
            logprobs: int,
            constraint: Constraint | None,
            started: float,
            embeddings: Any = None,
        ) -> Iterator[Token | Done]: ...

    def use_projector(self, path: Path, image_max_tokens: int | None = None) -> None:
        """Read images through this vision model's own vision tower (its directory, ``path``); loaded on
        the first image. A GGUF projector file is a GGUF model's, never an MLX model's."""
        if path.resolve() != self.path.resolve() or not describes_vision(self.config):
            raise UsageError(
                f"an MLX model reads images through its own vision tower; {path.name} is not this model's",
                "run an MLX vision model (its directory has a vision_config), or the GGUF with its mmproj",
            )
        if image_max_tokens is not None:
            raise UsageError("`image_max_tokens` is for GGUF projectors", "drop it for an MLX model")
        self._vision_path = path

    @property
    def sees_images(self) -> bool:
        return self._vision_path is not None

    def _vision_half(self) -> MlxVision:
        if self._vision_path is None:
            raise UsageError("this model was loaded without its vision tower: it does not see images", "")
        if self._vision is None:
            self._vision = MlxVision(self._vision_path, self.model, self.tokenizer, self.config)
        return self._vision

    def image_positions(self, image: bytes) -> int:
        return self._vision_half().span(image).positions

    def stream_images(
        self,
        ids: Sequence[int],
        at: Sequence[int],
        images: Sequence[bytes],
        params: SamplingParams,
        *,
        logprobs: int = 0,
        constraint: Constraint | None = None,
    ) -> Iterator[Token | Done]:
        """:meth:`stream` for a prompt with images: ``images[i]`` sits before token ``at[i]`` of ``ids``."""
        import mlx.core as mx

        vision = self._vision_half()
        started = time.perf_counter()
        before = snapshot(vision)
        prompt = image_prompt(vision, ids, at, images)
        if len(prompt.ids) >= self.n_ctx:
            hint = "raise `n_ctx`, or give fewer images"
            raise too_long(len(prompt.ids), prompt.image_positions, len(images), self.n_ctx, hint)
        seed = params.run_seed()
        if seed is not None:
            mx.random.seed(seed)
        if self._cache is None:
            self.reset()
        start = self.reused = self._prepare(prompt.keys)
        steps = self._sample(
            prompt.ids, prompt.keys, start, params, seed, logprobs, constraint, started, prompt.embeddings
        )
        yield from counted(steps, vision, prompt.image_positions, before)
