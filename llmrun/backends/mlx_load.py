"""What loading an MLX model does beyond mlx-lm's own load: the tokenizer kept per process, and the dtype
a model computes in on the CPU (see :mod:`llmrun.formats.mlx_runtime`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmrun.formats.mlx_runtime import computes_in_float32


def on_the_cpu_in_float32(model: Any, blas: str | None) -> None:
    """On the CPU with a fast BLAS, a model whose float32 weights fit computes in float32 (see
    :mod:`llmrun.formats.mlx_runtime`: about 20 times faster than mlx's CPU bfloat16)."""
    import mlx.core as mx
    import psutil
    from mlx.utils import tree_flatten

    if mx.default_device() != mx.cpu:
        return
    flat: Any = tree_flatten(model.parameters())
    weights = [value for _, value in flat]
    if any(v.dtype not in (mx.float32, mx.float16, mx.bfloat16) for v in weights):
        return  # quantized weights stay as they are
    if computes_in_float32(sum(v.size for v in weights), psutil.virtual_memory().available, blas):
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())


_TOKENIZERS: dict[tuple[str, tuple[int, ...] | None, tuple[tuple[str, int, int], ...]], Any] = {}
KEPT_TOKENIZERS = 4


def kept_tokenizer(path: Path, eos: tuple[int, ...] | None, load: Callable[..., Any]) -> Any:
    """The directory's transformers tokenizer, kept per process (by its files' sizes and times): reading
    one takes seconds (Gemma's tokenizer.json is 33 MB of JSON, parsed several times over), and a model is
    loaded again on a reload, a model switch, a draft of the same family. llmrun only reads it."""
    files = tuple(
        (f.name, (s := f.stat()).st_size, s.st_mtime_ns)
        for f in sorted(path.iterdir())
        if f.is_file() and (f.name.startswith("tokenizer") or f.name.endswith((".model", "_config.json", ".jinja")))
    )
    key = (str(path.resolve()), eos, files)
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) >= KEPT_TOKENIZERS:
            del _TOKENIZERS[next(iter(_TOKENIZERS))]
        _TOKENIZERS[key] = load(path, eos_token_ids=list(eos) if eos is not None else None)._tokenizer
    return _TOKENIZERS[key]
