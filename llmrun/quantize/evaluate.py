"""What a quantization cost: a model measured against its reference on a fixed text.

Both models are loaded by their own backends (GGUF through llama.cpp, a directory through
MLX), see the same token ids, and are compared by :mod:`llmrun.quantize.metrics` — one
implementation for every pair of backends. No printing here: the report is data.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmrun.backends.base import LoadedModel, LoadParams
from llmrun.errors import UsageError
from llmrun.files import Progress
from llmrun.formats.gguf_header import read_header
from llmrun.formats.output import tree_size
from llmrun.quantize.metrics import Comparison, compare


@dataclass(frozen=True, slots=True)
class Side:
    """One model of the comparison: what it is called, where it is, its format and type, its size."""

    name: str
    path: Path
    format: str  # gguf | mlx
    type: str  # Q4_K_M, F16, mlx 4-bit, bf16, …
    size_bytes: int


@dataclass(frozen=True, slots=True)
class QualityReport:
    reference: Side
    candidate: Side
    text: str  # "built-in" or the file's path
    comparison: Comparison
    seconds: float

    @property
    def size_ratio(self) -> float:
        """Candidate size / reference size."""
        return self.candidate.size_bytes / self.reference.size_bytes if self.reference.size_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        def side(s: Side) -> dict[str, Any]:
            return {**asdict(s), "path": str(s.path)}

        return {
            "reference": side(self.reference),
            "candidate": side(self.candidate),
            "size_ratio": round(self.size_ratio, 4),
            "text": self.text,
            **asdict(self.comparison),
            "seconds": round(self.seconds, 2),
        }


def describe(name: str, path: Path) -> Side:
    """A model file or directory, with its format and type, read from its header (bounded)."""
    if path.is_dir():
        from llmrun.formats.mlx_header import read_mlx_header

        header = read_mlx_header(path)
        bits = header.metadata.get("mlx.quantization.bits")
        kind = f"mlx {bits}-bit" if bits else _dtype(path)
        return Side(name, path, "mlx", kind, tree_size(path))
    from llmrun.formats.gguf_quantize import file_type

    return Side(name, path, "gguf", file_type(read_header(path)), path.stat().st_size)


def _dtype(path: Path) -> str:
    import json

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "16-bit"
    dtype = config.get("torch_dtype") or config.get("dtype")
    return str(dtype) if isinstance(dtype, str) else "16-bit"


def text_ids(reference: LoadedModel, candidate: LoadedModel, text: str, max_tokens: int | None) -> list[int]:
    """The text's tokens, which both models must produce alike (else they are different models)."""
    ids = reference.tokenize(text, add_bos=reference.adds_bos)
    if candidate.tokenize(text, add_bos=candidate.adds_bos) != ids:
        raise UsageError(
            "the two models tokenize the text differently, so their predictions cannot be compared",
            "compare a model with its own quantizations (same vocabulary)",
        )
    ids = ids[:max_tokens] if max_tokens else ids
    if len(ids) < 2:
        raise UsageError("the evaluation text is too short: it needs at least two tokens", "pass a longer `text`")
    return ids


def check_memory(reference: Side, candidate: Side, available: int) -> None:
    """Both models are in memory at once (an MLX model quantized on the CPU: expanded to 16 bits)."""
    from llmrun.engine.select import this_platform
    from llmrun.errors import InsufficientMemory
    from llmrun.units import format_bytes

    on_cpu = not this_platform().apple_silicon

    def resident(side: Side) -> int:
        expanded = on_cpu and side.format == "mlx" and side.type.startswith("mlx ")  # see backends.mlx.expand_on_cpu
        return side.size_bytes * (4 if expanded else 1)

    needed = resident(reference) + resident(candidate) + 512 * 1024 * 1024  # logits, buffers, runtime
    if needed > available:
        raise InsufficientMemory(
            f"comparing the two models needs about {format_bytes(needed)} (both are loaded at once) "
            f"but {format_bytes(available)} is available",
            "skip the report with `no_eval`, or run llmrun eval on a machine with more memory",
        )


def load_for_eval(side: Side, n_ctx: int, threads: int, *, vocab_only: bool = False) -> LoadedModel:
    from llmrun import backends
    from llmrun.backends.gguf import gpu_offload_supported

    offload = side.format == "gguf" and not vocab_only and gpu_offload_supported()
    params = LoadParams(n_ctx=n_ctx, n_threads=threads, n_gpu_layers=-1 if offload else 0, vocab_only=vocab_only)
    return backends.get(side.format).load(side.path, params)


def evaluate(
    reference: Side,
    candidate: Side,
    text: str,
    *,
    text_name: str,
    max_tokens: int | None,
    threads: int,
    progress: Progress | None = None,
    available_memory: int | None = None,
) -> QualityReport:
    """Load both models, teacher-force the text through each, and compare every position.
    The tokenizers are checked first; a GGUF's context is then sized to the text."""
    if available_memory is not None:
        check_memory(reference, candidate, available_memory)
    started = time.perf_counter()
    loaded: list[LoadedModel] = []
    try:
        # a GGUF's vocabulary loads in a moment; an MLX model loads once, whole (its tokenizer is the slow part)
        sides = (reference, candidate)
        ref_tok, cand_tok = (load_for_eval(s, 16, threads, vocab_only=s.format == "gguf") for s in sides)
        loaded += [ref_tok, cand_tok]
        ids = text_ids(ref_tok, cand_tok, text, max_tokens)
        n_ctx = max(16, len(ids))
        ref_model, cand_model = (
            load_for_eval(side, n_ctx, threads) if side.format == "gguf" else model
            for side, model in ((reference, ref_tok), (candidate, cand_tok))
        )
        loaded += [ref_model, cand_model]
        comparison = compare(ref_model, cand_model, ids, progress)
    finally:
        for model in loaded:
            model.close()
    return QualityReport(reference, candidate, text_name, comparison, time.perf_counter() - started)
