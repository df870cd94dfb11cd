"""A bounded, hostile-input-safe reader for GGUF headers.

Model files come from the internet. Before llama.cpp (or the ``gguf`` package,
whose reader trusts lengths in the file) sees one, this reader walks the header
and checks every count and length against the bytes that are actually left, so
a crafted file fails fast with :class:`ModelFileError` instead of hanging,
allocating gigabytes or crashing the process.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrun.errors import ModelFileError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_STRING_BYTES = 16 * 1024 * 1024  # a chat template is ~10 KB; keys far less
MAX_KEY_BYTES = 65535
MAX_TENSOR_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 2
KEEP_ARRAY_ITEMS = 4096  # larger arrays (vocabularies) are summarised, not kept
DEFAULT_ALIGNMENT = 32
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: llama.cpp aborts the process beyond it

# GGUF value types: id -> (struct format, size) for the fixed-size ones.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # UINT8
    1: ("<b", 1),  # INT8
    2: ("<H", 2),  # UINT16
    3: ("<h", 2),  # INT16
    4: ("<I", 4),  # UINT32
    5: ("<i", 4),  # INT32
    6: ("<f", 4),  # FLOAT32
    7: ("<?", 1),  # BOOL
    10: ("<Q", 8),  # UINT64
    11: ("<q", 8),  # INT64
    12: ("<d", 8),  # FLOAT64
}
_STRING = 8
_ARRAY = 9
_MIN_STRING = 8  # a string is at least its u64 length
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class ArraySummary:
    """A metadata array too long to keep (e.g. a 262k-entry vocabulary)."""

    item_type: int
    length: int


# ggml's tensor types: id -> (name, elements a block, bytes a block), as the gguf package's
# GGMLQuantizationType and GGML_QUANT_SIZES give them (tests/unit check they agree). Our own copy:
# importing gguf.constants imports the whole gguf package, numpy and yaml (~90 ms on every `run`).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_id: int
    shape: tuple[int, ...]
    offset: int  # relative to the start of the data section
    nbytes: int

    @property
    def type_name(self) -> str:
        known = GGML_TYPES.get(self.type_id)
        return known[0] if known else f"type {self.type_id}"


@dataclass(frozen=True, slots=True)
class GgufHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    data_offset: int
    file_size: int

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else "unknown"

    def arch_value(self, key: str, default: Any = None) -> Any:
        """``<architecture>.<key>``, e.g. ``arch_value("block_count")``."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) and value.strip() else None

    @property
    def tool_use_template(self) -> str | None:
        """The model's named template for requests with tools (Hermes 2 Pro, Command R), if any."""
        value = self.metadata.get("tokenizer.chat_template.tool_use")
        return value if isinstance(value, str) and value.strip() else None


class _Cursor:
    """Reads little-endian values from a buffer, refusing to read past its end."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.path = path

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(
            f"{self.path} is not a valid GGUF file: {what} (at byte {self.pos})",
            "the file is corrupt or truncated; delete it and download it again",
        )

    @property
    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        if n < 0 or n > self.left:
            raise self.fail(f"{what} needs {n} bytes but only {self.left} remain")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, type_id: int, what: str) -> Any:
        fmt, size = _SCALARS[type_id]
        start = self.take(size, what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def u32(self, what: str) -> int:
        value: int = self.scalar(4, what)
        return value

    def u64(self, what: str) -> int:
        value: int = self.scalar(10, what)
        return value

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        length = self.u64(f"{what} length")
        if length > limit:
            raise self.fail(f"{what} claims {length} bytes (limit {limit})")
        start = self.take(length, what)
        try:
            return bytes(self.buf[start : start + length]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8") from exc

    def skip_strings(self, count: int, what: str) -> None:
        """Skip ``count`` strings (a vocabulary) with the same checks as :meth:`string`, quickly."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack = _U64.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                raise self.fail(f"{what} length needs 8 bytes but only {size - pos} remain")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > MAX_STRING_BYTES or pos + length > size:
                self.pos = pos
                raise self.fail(f"{what} claims {length} bytes, more than the file can hold")
            pos += length
        self.pos = pos


def _min_size(type_id: int) -> int:
    if type_id in _SCALARS:
        return _SCALARS[type_id][1]
    if type_id == _STRING:
        return _MIN_STRING
    return 12  # nested array: its own type (u32) and count (u64)


def _read_value(cur: _Cursor, type_id: int, key: str, depth: int = 0) -> Any:
    if type_id in _SCALARS:
        return cur.scalar(type_id, f"value of {key}")
    if type_id == _STRING:
        return cur.string(f"value of {key}")
    if type_id != _ARRAY:
        raise cur.fail(f"{key} has unknown value type {type_id}")
    if depth >= MAX_NESTING:
        raise cur.fail(f"{key} nests arrays deeper than {MAX_NESTING}")
    item_type = cur.u32(f"array type of {key}")
    if item_type not in _SCALARS and item_type not in (_STRING, _ARRAY):
        raise cur.fail(f"{key} has unknown array item type {item_type}")
    count = cur.u64(f"array length of {key}")
    if count * _min_size(item_type) > cur.left:
        raise cur.fail(f"{key} claims {count} items, more than the file can hold")
    if item_type in _SCALARS and count > KEEP_ARRAY_ITEMS:
        cur.take(count * _SCALARS[item_type][1], f"items of {key}")
        return ArraySummary(item_type, count)
    if item_type == _STRING and count > KEEP_ARRAY_ITEMS:
        cur.skip_strings(count, f"item of {key}")
        return ArraySummary(item_type, count)
    return [_read_value(cur, item_type, key, depth + 1) for _ in range(count)]


def _tensor_nbytes(cur: _Cursor, name: str, type_id: int, shape: tuple[int, ...]) -> int:
    known = GGML_TYPES.get(type_id)
    if known is None:
        raise cur.fail(f"tensor {name} has unknown type {type_id}")
    _, block_size, type_size = known
    elements = 1
    for dim in shape:
        elements *= dim
    if any(dim < 1 for dim in shape) or elements >= 2**63:  # llama.cpp's own checks (gguf.cpp)
        raise cur.fail(f"tensor {name} has shape {list(shape)} (each dimension at least 1, under 2^63 elements)")
    if shape and shape[0] % block_size:
        raise cur.fail(f"tensor {name} row of {shape[0]} is not a multiple of {block_size}")
    return elements // block_size * type_size


def read_header(path: Path) -> GgufHeader:
    """Parse and validate the header of the GGUF file at ``path``.

    Raises :class:`ModelFileError` for anything that is not a complete, sane GGUF.
    """
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size < 24:
                raise ModelFileError(
                    f"{path} is not a GGUF file ({size} bytes, too short for a header)",
                    "check the path; a GGUF model file is usually hundreds of megabytes",
                )
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Cursor(buf, path), path)
    except FileNotFoundError as exc:
        raise ModelFileError(f"model file {path} does not exist", "check the path") from exc
    except IsADirectoryError as exc:
        raise ModelFileError(
            f"{path} is a directory, not a GGUF file",
            "pass the .gguf file inside it (MLX model directories are not supported by this version)",
        ) from exc
    except PermissionError as exc:
        raise ModelFileError(f"cannot read {path}: permission denied", "check its permissions") from exc


def _parse(cur: _Cursor, path: Path) -> GgufHeader:
    magic_start = cur.take(4, "magic")
    if bytes(cur.buf[magic_start : magic_start + 4]) != MAGIC:
        raise ModelFileError(
            f"{path} is not a GGUF file (it does not start with 'GGUF')",
            "llmrun runs .gguf files; convert other formats first or pick the .gguf file",
        )
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    if n_kv * (_MIN_STRING + 4 + 1) > cur.left:
        raise cur.fail(f"claims {n_kv} metadata entries, more than the file can hold")
    if n_tensors * (_MIN_STRING + 4 + 8 + 4 + 8) > cur.left:
        raise cur.fail(f"claims {n_tensors} tensors, more than the file can hold")

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key", MAX_KEY_BYTES)
        type_id = cur.u32(f"type of {key}")
        if key in metadata:
            raise cur.fail(f"metadata key {key} appears twice")
        metadata[key] = _read_value(cur, type_id, key)

    tensors: list[TensorInfo] = []
    for _ in range(n_tensors):
        name = cur.string("tensor name", MAX_KEY_BYTES)
        n_dims = cur.u32(f"dimension count of {name}")
        if not 1 <= n_dims <= MAX_TENSOR_DIMS:
            raise cur.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_TENSOR_DIMS})")
        shape = tuple(cur.u64(f"shape of {name}") for _ in range(n_dims))
        type_id = cur.u32(f"type of {name}")
        offset = cur.u64(f"offset of {name}")
        tensors.append(TensorInfo(name, type_id, shape, offset, _tensor_nbytes(cur, name, type_id, shape)))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")
    data_offset = -(-cur.pos // alignment) * alignment
    for tensor in tensors:
        end = data_offset + tensor.offset + tensor.nbytes
        if end > cur.size:
            raise ModelFileError(
                f"{path} is truncated: tensor {tensor.name} ends at byte {end:,} but the file has {cur.size:,} bytes",
                "the download was cut short; delete the file and download it again",
            )
    return GgufHeader(path, version, metadata, tuple(tensors), data_offset, cur.size)


def is_embedding_model(header: GgufHeader) -> bool:
    """llama.cpp pools a sentence vector only for models that name a pooling type."""
    return header.arch_value("pooling_type") is not None


def check_loadable(header: GgufHeader) -> None:
    """Refuse files that parse but that llama.cpp would abort the process on.

    llama.cpp asserts (and kills the process) on some malformed models instead of
    returning an error, so the basics are checked here first.
    """
    missing = [
        what
        for what, ok in (
            ("general.architecture", isinstance(header.metadata.get("general.architecture"), str)),
            ("a vocabulary (tokenizer.ggml.tokens)", "tokenizer.ggml.tokens" in header.metadata),
            ("any tensors", bool(header.tensors)),
        )
        if not ok
    ]
    layers = header.arch_value("block_count")
    if isinstance(layers, int) and not 0 < layers <= MAX_LAYERS:
        missing.append(f"a sane layer count (claims {layers}, llama.cpp allows 1 to {MAX_LAYERS})")
    if missing:
        raise ModelFileError(
            f"{header.path} is not a runnable model: it lacks {', '.join(missing)}",
            "it may be a LoRA adapter, a vocabulary-only file or a damaged download; pick the model's .gguf",
        )
