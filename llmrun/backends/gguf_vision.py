"""Images on a GGUF model through llama.cpp's libmtmd (``llama_cpp.mtmd_cpp``), driven from llmrun's loop.

A vision model is a text model and a projector file (``mmproj``): the projector's vision tower turns an
image into embeddings the text model reads at as many positions as the image has tokens. libmtmd
decodes the image bytes (stb_image), resizes them to the projector's input, encodes them and decodes
the embeddings into the text model's context; llmrun does the rest as for text: the prompt is rendered
by its own template renderer (with the image where the marker was), the text on either side tokenized
so that user text never becomes special tokens, and the answer sampled by the usual loop.

Not through llama-cpp-python's chat handlers: they fetch any URL (``file://`` too), clear the KV cache
on every call and splice image markers into templates by string replacement.

The context keeps what it evaluated: each position's key is its token, or for an image's positions a
negative number derived from the image's sha256, so a prompt that starts like the last one (a chat's
next turn, the same image again) evaluates only what differs. Encoded images are kept by content hash
(``hits`` counts reuse), so an image met again is not encoded again.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrun.backends.images import image_keys
from llmrun.errors import BackendError, ModelFileError, UsageError
from llmrun.formats.image import ImageError, sniff

KEPT_ENCODINGS = 16
_TEXT, _IMAGE = 0, 1


@dataclass(frozen=True)
class ImageSpan:
    """One image as the text model reads it: the text libmtmd puts before and after it (``<start_of_image>``
    and ``<end_of_image>`` for Gemma 3) and the image's own positions."""

    digest: str
    before: list[int]
    tokens: int  # embeddings (what usage counts as the image's tokens)
    positions: int  # context positions they take
    after: list[int]
    chunks: Any  # libmtmd's chunks, kept for decoding (freed with the span)
    index: int  # which chunk is the image

    @property
    def length(self) -> int:
        return len(self.before) + self.positions + len(self.after)


class Projector:
    """A projector loaded on a text model's weights (libmtmd's context)."""

    def __init__(
        self, path: Path, llama: Any, n_threads: int, image_max_tokens: int | None = None, log: Any = None
    ) -> None:
        """``log``: llama.cpp's log callback the backend routes its lines through (libmtmd's go there too)."""
        from llama_cpp import mtmd_cpp

        self._m = mtmd_cpp
        if log is not None:
            mtmd_cpp.mtmd_helper_log_set(log, ctypes.c_void_p(0))
        self.path = path
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.warmup = False
        params.n_threads = n_threads
        if image_max_tokens:
            params.image_max_tokens = image_max_tokens
        self._ctx = mtmd_cpp.mtmd_init_from_file(str(path).encode(), llama._model.model, params)
        if not self._ctx:
            raise ModelFileError(
                f"{path.name} is not a projector llama.cpp can load for this model",
                "give the mmproj file made for this model (its embedding width must match the model's)",
            )
        if not mtmd_cpp.mtmd_support_vision(self._ctx):
            self.close()
            raise ModelFileError(f"{path.name} has no vision encoder", "give the model's image projector (mmproj)")
        self._n_embd = int(llama._model.n_embd())
        self._encoded: OrderedDict[str, Any] = OrderedDict()
        self._positions: dict[str, int] = {}
        self.hits = 0  # images met again: their encoding reused
        self.encode_seconds = 0.0

    def span(self, data: bytes, name: str = "the image") -> ImageSpan:
        """What ``data`` becomes in the prompt; :class:`ImageError` when it is not an image llmrun passes on."""
        m = self._m
        bitmap = decode(m, self._ctx, data, name)
        chunks = m.mtmd_input_chunks_init()
        try:
            marker = m.mtmd_default_marker()
            text = m.mtmd_input_text(marker, len(marker), False, True)
            bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
            status = m.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1)
        finally:
            m.mtmd_bitmap_free(bitmap)
        if status != 0:
            m.mtmd_input_chunks_free(chunks)
            raise ImageError(f"{name} could not be prepared for the projector (libmtmd: {status})", "try another image")
        before: list[int] = []
        after: list[int] = []
        tokens = positions = 0
        index = -1
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == _TEXT:
                n = ctypes.c_size_t()
                ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                (after if index >= 0 else before).extend(int(ids[k]) for k in range(n.value))
            else:
                index = i
                tokens = int(m.mtmd_input_chunk_get_n_tokens(chunk))
                positions = int(m.mtmd_input_chunk_get_n_pos(chunk))
        if index < 0:
            m.mtmd_input_chunks_free(chunks)
            raise ImageError(f"{name} gave the projector nothing to encode", "try another image")
        digest = hashlib.sha256(data).hexdigest()
        return ImageSpan(digest, before, tokens, positions, after, chunks, index)

    def positions(self, data: bytes) -> int:
        """The context positions ``data`` takes, the text around it included (kept by content hash)."""
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self._positions:
            span = self.span(data)
            self.free(span)
            self._positions[digest] = span.length
        return self._positions[digest]

    def free(self, span: ImageSpan) -> None:
        self._m.mtmd_input_chunks_free(span.chunks)

    def decode(self, span: ImageSpan, llama: Any, n_past: int, n_batch: int) -> int:
        """Evaluate the image's embeddings into ``llama``'s context at ``n_past``; the positions after it."""
        m = self._m
        chunk = m.mtmd_input_chunks_get(span.chunks, span.index)
        embeddings = self._encoded.get(span.digest)
        if embeddings is None:
            started = time.perf_counter()
            if m.mtmd_encode_chunk(self._ctx, chunk) != 0:
                raise BackendError(
                    "the projector could not encode the image", "try another image; `debug` shows llama.cpp's log"
                )
            out = m.mtmd_get_output_embd(self._ctx)
            size = span.tokens * self._n_embd
            embeddings = (ctypes.c_float * size)()
            ctypes.memmove(embeddings, out, size * ctypes.sizeof(ctypes.c_float))
            self.encode_seconds += time.perf_counter() - started
            self._encoded[span.digest] = embeddings
            while len(self._encoded) > KEPT_ENCODINGS:
                self._encoded.popitem(last=False)
        else:
            self.hits += 1
            self._encoded.move_to_end(span.digest)
        new_past = ctypes.c_int32(0)
        status = m.mtmd_helper_decode_image_chunk(
            self._ctx,
            llama._ctx.ctx,
            chunk,
            embeddings,
            n_past,
            0,
            n_batch,
            ctypes.byref(new_past),
            m.mtmd_helper_post_decode_callback(),  # none
            None,
        )
        if status != 0:
            raise BackendError(
                f"llama.cpp could not evaluate the image's embeddings ({status})", "`debug` shows llama.cpp's log"
            )
        return int(new_past.value)

    def close(self) -> None:
        if self._ctx:
            self._m.mtmd_free(self._ctx)
            self._ctx = None
        self._encoded.clear()


def decode(m: Any, ctx: Any, data: bytes, name: str = "the image") -> Any:
    """``data`` decoded by libmtmd (stb_image) into a bitmap the caller frees, once llmrun's header check
    (:func:`llmrun.formats.image.sniff`: format, bytes, pixels) let it through; :class:`ImageError` when either
    refuses it. An image never asks the decoder for more pixels than its checked header declares
    (``fuzz/fuzz_image_decode.py`` checks it)."""
    sniff(data, name)
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    bitmap = m.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False, None)
    if not bitmap:
        raise ImageError(f"{name} could not be decoded (the file is damaged or truncated)", "give a whole image")
    return bitmap


@dataclass(frozen=True)
class Layout:
    """A prompt with images, position by position: runs of text tokens and images, and each position's key."""

    pieces: list[list[int] | ImageSpan]
    keys: list[int]


def layout(ids: Sequence[int], at: Sequence[int], spans: Sequence[ImageSpan]) -> Layout:
    """``ids`` with ``spans[i]`` inserted before token ``at[i]`` (the text libmtmd wraps an image in joins
    the text runs)."""
    if len(at) != len(spans):
        raise UsageError(f"the prompt has {len(at)} places for images and {len(spans)} images", "")
    pieces: list[list[int] | ImageSpan] = [[]]
    keys: list[int] = []
    start = 0
    for where, span in zip(at, spans, strict=True):
        text = [*ids[start:where], *span.before]
        _text(pieces, text)
        pieces.append(span)
        pieces.append([])
        _text(pieces, span.after)
        start = where
    _text(pieces, list(ids[start:]))
    for piece in pieces:
        keys += image_keys(piece.digest, piece.positions) if isinstance(piece, ImageSpan) else piece
    return Layout([p for p in pieces if not (isinstance(p, list) and not p)], keys)


def _text(pieces: list[list[int] | ImageSpan], tokens: list[int]) -> None:
    last = pieces[-1]
    if isinstance(last, list):
        last.extend(tokens)
    else:
        pieces.append(list(tokens))


def evaluate(projector: Projector, llama: Any, plan: Layout) -> int:
    """Bring ``llama``'s context up to the text after the last image, reusing the longest prefix it already
    holds; the text after the last image is the sampling loop's to evaluate (in one batch, as a text
    prompt is). The positions reused."""
    if not plan.pieces or isinstance(plan.pieces[-1], ImageSpan):
        raise UsageError("the prompt ends with an image", "add some text after it")
    trailing = len(plan.keys) - len(plan.pieces[-1])
    held = list(llama.input_ids[: llama.n_tokens])
    common = 0
    for a, b in zip(held, plan.keys, strict=False):
        if a != b:
            break
        common += 1
    common = min(common, len(plan.keys) - 1)
    # an image is evaluated whole: a prefix that ends inside one starts at the image
    position = 0
    for piece in plan.pieces:
        length = piece.positions if isinstance(piece, ImageSpan) else len(piece)
        if isinstance(piece, ImageSpan) and position < common < position + length:
            common = position
        position += length
    if common < llama.n_tokens and not llama._ctx.kv_cache_seq_rm(-1, common, -1):
        common = 0
        llama.reset()
        llama._ctx.kv_cache_clear()
    llama.n_tokens = common
    position = 0
    for piece in plan.pieces[:-1]:
        length = piece.positions if isinstance(piece, ImageSpan) else len(piece)
        if position + length <= common:
            position += length
            continue
        if isinstance(piece, ImageSpan):
            after = projector.decode(piece, llama, llama.n_tokens, llama.n_batch)
            llama.input_ids[llama.n_tokens : after] = plan.keys[llama.n_tokens : after]
            llama.n_tokens = after
        else:
            llama.eval(piece[max(0, common - position) :])
        position += length
    assert llama.n_tokens == max(common, trailing)
    return common
