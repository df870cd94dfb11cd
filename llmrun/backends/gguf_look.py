"""Looking inside llama.cpp's forward pass: tensors captured through its eval callback.

llama.cpp names the tensors of its graph as it builds them (``kq_soft_max-5``: layer 5's
attention weights, ``l_out-5``: layer 5's output). A context created with ``cb_eval``
asks the callback about every node before computing it; a node the callback wants ends
a piece of the graph, and once computed the callback reads it. Only the nodes shown are
asked for: every one splits the graph. The capture context:

- has flash attention off: the fused kernel never forms the attention weights;
- asks for every position's output, so the last layer keeps every row (llama.cpp drops
  the rows no one reads before the last layer), and stops the graph once the last layer's
  output is read: the output head over the whole vocabulary is never run (the logit lens
  applies it to the rows it shows; on Gemma 3 it costs more than all the layers together);
- evaluates the prompt in micro-batches of :data:`CHUNK` tokens; each piece's weights
  (its queries against the cells so far) are put in place by the piece's first position;
- has a fresh KV cache, so key cell i holds position i (a sliding-window cache too, as
  long as the prompt fits its window: longer prompts are refused).

Tensor data is copied out through ggml's own API (``ggml_backend_tensor_get``), laid out
by the tensor's strides. The logit lens and the embedding view read the output head and
the token embeddings from the GGUF file, dequantized by gguf-py a chunk of rows at a time.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from llmrun.backends.trace import Geometry, TopK, TopKAccumulator, Trace, check_window
from llmrun.errors import BackendError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from llmrun.backends.base import LoadParams
    from llmrun.formats.gguf_header import GgufHeader, TensorInfo

    F32 = npt.NDArray[np.float32]


class GgufModel(Protocol):
    """What a capture reads of a loaded GGUF model (:class:`~llmrun.backends.gguf.GgufModel`)."""

    path: Path
    llama: Any  # llama_cpp.Llama
    load_params: LoadParams


ATTENTION = "kq_soft_max"  # llama.cpp's name for a layer's attention weights (``kq_soft_max-5``)
OUTPUT = "l_out"  # and for a layer's output
CHUNK = 128  # positions a micro-batch of the capture context
_ROPE = {-1: "", 0: "norm", 2: "neox", 8: "mrope", 40: "imrope", 24: "vision"}
_GGML_F32, _GGML_F16 = 0, 1


class _TensorHead(ctypes.Structure):
    """The first fields of ``struct ggml_tensor`` (ggml.h): element type, buffer, shape and strides."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


def _ggml() -> Any:
    from llama_cpp import _ggml

    lib = _ggml.libggml
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    return lib


def read_tensor(lib: Any, pointer: int) -> F32:
    """A computed tensor's values as float32, shaped (ne3, ne2, ne1, ne0) by its strides."""
    import numpy as np

    head = _TensorHead.from_address(pointer)
    if head.type not in (_GGML_F32, _GGML_F16):
        raise BackendError(f"a captured tensor has ggml type {head.type}", "report it: look reads F32 and F16")
    size = int(lib.ggml_nbytes(pointer))
    raw = np.empty(size, dtype=np.uint8)
    lib.ggml_backend_tensor_get(pointer, raw.ctypes.data, 0, size)
    dtype = np.float32 if head.type == _GGML_F32 else np.float16
    shape = tuple(int(head.ne[i]) for i in (3, 2, 1, 0))
    strides = tuple(int(head.nb[i]) for i in (3, 2, 1, 0))
    view: Any = np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides)
    result: F32 = view.astype(np.float32)
    return result


def geometry(model: GgufModel) -> Geometry:
    import llama_cpp

    weights = model.llama._model.model
    header = _header(model)
    rope = int(llama_cpp.llama_model_rope_type(weights))
    return Geometry(
        architecture=header.architecture,
        n_layer=int(llama_cpp.llama_model_n_layer(weights)),
        n_head=int(llama_cpp.llama_model_n_head(weights)),
        n_head_kv=int(llama_cpp.llama_model_n_head_kv(weights)),
        n_embd=int(llama_cpp.llama_model_n_embd(weights)),
        n_vocab=int(model.llama.n_vocab()),
        sliding_window=int(llama_cpp.llama_model_n_swa(weights)),
        rope=_ROPE.get(rope, str(rope)),
        rope_base=float(header.arch_value("rope.freq_base", 10_000.0)),
    )


class _Capture:
    """The eval callback: which nodes to stop at, and their values as they are computed."""

    def __init__(self, lib: Any, layers: Sequence[int], n_layer: int) -> None:
        self.lib = lib
        self.wanted = {f"{ATTENTION}-{layer}" for layer in layers} | {f"{OUTPUT}-{layer}" for layer in range(n_layer)}
        self.last = f"{OUTPUT}-{n_layer - 1}"  # nothing after it is read: the rest of the graph is skipped
        self.values: dict[str, F32] = {}
        self.error: BaseException | None = None

    def __call__(self, pointer: int, ask: bool, user_data: int) -> bool:
        name = ""
        try:
            name = (self.lib.ggml_get_name(pointer) or b"").decode("utf-8", "replace")
            if ask:
                return name in self.wanted
            if name in self.wanted:
                self.values[name] = read_tensor(self.lib, pointer)
        except BaseException as exc:  # raised again after the pass: a callback must not raise into C
            self.error = exc
        return name != self.last  # False ends this graph's computation here


def trace(model: GgufModel, ids: Sequence[int], layers: Sequence[int], top: int) -> Trace:
    """``top`` is unused: the pass stops before the output head (see the module's notes)."""
    import llama_cpp
    import numpy as np
    from llama_cpp import _internals as internals

    geom = geometry(model)
    n = len(ids)
    check_window(geom, n)
    lib = _ggml()
    capture = _Capture(lib, layers, geom.n_layer)
    callback = llama_cpp.ggml_backend_sched_eval_callback(capture)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = max(256, -(-n // 256) * 256)
    params.n_batch = params.n_ubatch = CHUNK
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = model.load_params.n_threads
    params.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED: only the unfused path forms the weights
    params.cb_eval = callback
    params.cb_eval_user_data = None
    attention = {layer: np.zeros((geom.n_head, n, n), dtype=np.float32) for layer in layers}
    hidden = np.zeros((geom.n_layer, n, geom.n_embd), dtype=np.float32)
    attention_missing: set[int] = set()
    outputs_missing: set[int] = set()
    started = time.perf_counter()
    ctx = internals.LlamaContext(model=model.llama._model, params=params, verbose=False)
    batch = internals.LlamaBatch(n_tokens=CHUNK, embd=0, n_seq_max=1, verbose=False)
    try:
        for start in range(0, n, CHUNK):
            part = list(ids[start : start + CHUNK])
            end = start + len(part)
            capture.values.clear()
            batch.set_batch(part, n_past=start, logits_all=True)
            ctx.decode(batch)
            if capture.error is not None:
                raise capture.error
            for layer in range(geom.n_layer):
                out = capture.values.get(f"{OUTPUT}-{layer}")
                if out is None:
                    outputs_missing.add(layer)
                else:
                    hidden[layer, start:end] = out.reshape(-1, geom.n_embd)[: len(part)]
            for layer in layers:
                weights = capture.values.get(f"{ATTENTION}-{layer}")
                if weights is None:
                    attention_missing.add(layer)
                else:  # (1, heads, queries, key cells): cell i holds position i in a fresh cache
                    attention[layer][:, start:end, :end] = weights[0, :, : len(part), :end]
    finally:
        batch.close()
        ctx.close()
    notes = []
    if outputs_missing:
        notes.append(
            f"no logit lens: llama.cpp's graph for {geom.architecture} names no {OUTPUT} "
            f"for layer{'s' if len(outputs_missing) > 1 else ''} {_listed(outputs_missing)}"
        )
    if attention_missing:
        notes.append(
            f"no attention weights for layer{'s' if len(attention_missing) > 1 else ''} {_listed(attention_missing)}: "
            f"llama.cpp's graph for {geom.architecture} names no {ATTENTION} there (not an attention layer, "
            "or a fused kernel)"
        )
    kept = {layer: weights for layer, weights in attention.items() if layer not in attention_missing}
    seconds = time.perf_counter() - started
    return Trace(tuple(ids), geom, kept, hidden, None, seconds, notes, complete=not outputs_missing)


def _listed(layers: set[int]) -> str:
    return ", ".join(str(layer) for layer in sorted(layers))


def _header(model: GgufModel) -> GgufHeader:
    from llmrun.formats.gguf_header import read_header
    from llmrun.formats.header_cache import cached_header

    return cached_header(model.path, read_header)


def _tensor(header: GgufHeader, *names: str) -> TensorInfo | None:
    by_name = {t.name: t for t in header.tensors}
    return next((by_name[name] for name in names if name in by_name), None)


def _raw_rows(header: GgufHeader, info: TensorInfo) -> Any:
    """A 2-D tensor of the file as stored: (rows, bytes a row), memory-mapped."""
    import numpy as np

    rows = int(info.shape[1]) if len(info.shape) > 1 else 1
    offset = header.data_offset + info.offset
    data = np.memmap(header.path, dtype=np.uint8, mode="r", offset=offset, shape=(info.nbytes,))
    return data.reshape(rows, info.nbytes // rows)


def _dequantized(info: TensorInfo, raw: Any) -> F32:
    """Stored rows of ``info`` as float32 (rows, width)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        values = dequantize(raw, GGMLQuantizationType(info.type_id))
    except (NotImplementedError, ValueError) as exc:
        raise BackendError(
            f"{info.name} is stored as {info.type_name}, which gguf-py cannot dequantize ({exc})",
            "look at a model quantized with a common type (Q4_K, Q8_0, F16)",
        ) from exc
    result: F32 = np.asarray(values, dtype=np.float32).reshape(raw.shape[0], int(info.shape[0]))
    return result


def tensor_rows(header: GgufHeader, info: TensorInfo, chunk: int) -> Iterator[tuple[int, F32]]:
    """A 2-D tensor of the file dequantized to float32, ``chunk`` rows at a time."""
    raw = _raw_rows(header, info)
    for start in range(0, raw.shape[0], chunk):
        yield start, _dequantized(info, raw[start : start + chunk])


def _embedding_tensor(model: GgufModel) -> tuple[GgufHeader, TensorInfo]:
    header = _header(model)
    info = _tensor(header, "token_embd.weight")
    if info is None:
        raise BackendError(f"{model.path.name} has no token_embd.weight", "look needs a token embedding matrix")
    return header, info


def embedding(model: GgufModel, ids: Sequence[int]) -> F32:
    header, info = _embedding_tensor(model)
    return _dequantized(info, _raw_rows(header, info)[list(ids)])


def embedding_rows(model: GgufModel, chunk: int = 16384) -> Iterator[tuple[int, F32]]:
    header, info = _embedding_tensor(model)
    yield from tensor_rows(header, info, chunk)


def lens(model: GgufModel, hidden: F32, top: int, chunk: int = 16384) -> TopK:
    """Final norm (RMS, or LayerNorm where the file has its bias), output head, final soft-capping."""
    import numpy as np

    header = _header(model)
    head = _tensor(header, "output.weight", "token_embd.weight")
    norm = _tensor(header, "output_norm.weight")
    if head is None or norm is None:
        raise BackendError(f"{model.path.name} has no output head or final norm", "the logit lens needs both")
    weight = next(tensor_rows(header, norm, 1))[1].reshape(-1)
    bias_info = _tensor(header, "output_norm.bias")
    x = hidden.astype(np.float32)
    if bias_info is not None:
        eps = float(header.arch_value("attention.layer_norm_epsilon", 1e-5))
        centred = x - x.mean(axis=-1, keepdims=True)
        bias = next(tensor_rows(header, bias_info, 1))[1].reshape(-1)
        normed = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps) * weight + bias
    else:
        eps = float(header.arch_value("attention.layer_norm_rms_epsilon", 1e-6))
        normed = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight
    cap = float(header.arch_value("final_logit_softcapping", 0.0) or 0.0)
    acc = TopKAccumulator(x.shape[0], top)
    for start, rows in tensor_rows(header, head, chunk):
        logits = normed @ rows.T
        if cap:
            logits = np.tanh(logits / cap) * cap
        acc.add(start, logits)
    return acc.result()
