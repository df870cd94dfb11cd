"""Unquantized GGUF files: any GGUF dequantized to F16, BF16 or F32 (``llmrun convert --to gguf``).

The source's metadata is copied as it is (its ``general.file_type`` set to the new
type), and each tensor is dequantized with the ``gguf`` package and written one at a
time, so memory holds one tensor, not the model. As llama.cpp's own converter does,
one-dimensional tensors (norms, biases) stay F32. The result is the usual source for
``llmrun quantize`` and the reference its quality report compares against.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmrun.errors import UsageError
from llmrun.files import Progress
from llmrun.formats.gguf_header import read_header
from llmrun.formats.memory import parameter_count
from llmrun.formats.output import check_destination, staged

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

FLOAT_TYPES = {"F16": 1, "BF16": 32, "F32": 0}  # name → llama_ftype
_BYTES = {"F16": 2, "BF16": 2, "F32": 4}


@dataclass(frozen=True, slots=True)
class Written:
    path: Path
    architecture: str
    type: str
    tensors: int
    size_bytes: int
    seconds: float


def float_type(name: str) -> str:
    upper = name.upper()
    if upper not in FLOAT_TYPES:
        raise UsageError(f"`type` must be one of {', '.join(t.lower() for t in FLOAT_TYPES)}, got {name!r}", "")
    return upper


@dataclass(frozen=True, slots=True)
class Tensor:
    """One tensor to write: its GGUF name, numpy shape, and a function giving its float32 values."""

    name: str
    shape: tuple[int, ...]
    values: Callable[[], npt.NDArray[np.float32]]


ALWAYS_F32 = ("position_embd.weight", "token_types.weight")  # added to activations: llama.cpp wants F32


def tensor_type(name: str, shape: tuple[int, ...], out_type: str) -> Any:
    """The ggml type a tensor is written as: ``out_type``, except 1-D tensors and BERT's position and
    token-type embeddings (as llama.cpp's converter writes them), which stay F32."""
    from gguf.constants import GGMLQuantizationType

    if len(shape) <= 1 or name in ALWAYS_F32:
        return GGMLQuantizationType.F32
    return GGMLQuantizationType[out_type]


def write_gguf(
    path: Path,
    architecture: str,
    metadata: Callable[[Any], None],
    tensors: list[Tensor],
    out_type: str,
    progress: Progress,
    alignment: int | None = None,
) -> None:
    """Write a GGUF tensor by tensor: ``metadata(writer)`` adds the key/values, then each tensor
    is encoded as ``out_type`` and written; the tensor table is written first from the shapes."""
    import numpy as np
    from gguf import GGUFWriter
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape, quantize

    writer = GGUFWriter(path, architecture)
    if alignment:
        writer.data_alignment = alignment
    metadata(writer)
    for tensor in tensors:
        qtype = tensor_type(tensor.name, tensor.shape, out_type)
        byte_shape = quant_shape_to_byte_shape(tensor.shape, qtype) if qtype == GGMLQuantizationType.BF16 else None
        item = 4 if qtype == GGMLQuantizationType.F32 else 2
        nbytes = int(np.prod(byte_shape)) if byte_shape else int(np.prod(tensor.shape)) * item
        dtype = np.uint8 if byte_shape else (np.float32 if item == 4 else np.float16)
        writer.add_tensor_info(tensor.name, byte_shape or tensor.shape, np.dtype(dtype), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    try:
        for done, tensor in enumerate(tensors, 1):
            values = np.ascontiguousarray(tensor.values().reshape(tensor.shape), dtype=np.float32)
            writer.write_tensor_data(quantize(values, tensor_type(tensor.name, tensor.shape, out_type)))
            progress("write tensors", done, len(tensors))
    finally:
        writer.close()


def gguf_to_float(
    source: Path, dest: Path, out_type: str = "F16", *, force: bool = False, progress: Progress | None = None
) -> Written:
    """``source`` (any type the gguf package dequantizes) written as an ``out_type`` GGUF at ``dest``."""
    out_type = float_type(out_type)
    started = time.perf_counter()
    header = read_header(source)  # bounded first: the gguf package's reader trusts lengths
    n_params = parameter_count(header)
    check_destination(dest, force, n_params * _BYTES[out_type] + 16 * 1024 * 1024, directory=False)
    step = progress or (lambda what, done, total: None)
    step("read the GGUF", 0, 1)
    from gguf import GGUFReader

    reader = GGUFReader(source)
    step("read the GGUF", 1, 1)
    tensors = [_dequantizing(t) for t in reader.tensors]
    alignment = _field(reader, "general.alignment")
    with staged(dest, force, directory=False) as staging:
        write_gguf(
            staging,
            header.architecture,
            lambda writer: _copy_fields(reader, writer, FLOAT_TYPES[out_type]),
            tensors,
            out_type,
            step,
            alignment if isinstance(alignment, int) else None,
        )
    seconds = time.perf_counter() - started
    return Written(dest, header.architecture, out_type, len(tensors), dest.stat().st_size, seconds)


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _copy_fields(reader: Any, writer: Any, file_type: int) -> None:
    from gguf.constants import GGUFValueType

    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type", "general.alignment"):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type)
    writer.add_file_type(file_type)


def _dequantizing(tensor: Any) -> Tensor:
    import numpy as np
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))

    def values() -> npt.NDArray[np.float32]:
        try:
            return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        except NotImplementedError:
            raise UsageError(
                f"the gguf package cannot dequantize {tensor.tensor_type.name} (tensor {tensor.name})",
                "start from a file with another quant type (Q8_0, Q4_K_M, F16, …)",
            ) from None

    return Tensor(tensor.name, shape, values)
