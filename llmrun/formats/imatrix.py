"""Importance matrices for llama.cpp's quantizer, read from the files ``llama-imatrix`` writes.

Two formats: the current GGUF one (``<tensor>.in_sum2`` and ``<tensor>.counts`` tensors;
the importance is their quotient, per expert matrix) and the legacy ``.dat`` one (a count,
then per entry: name, number of calls, values summed over the calls). Both are read with
bounds checks: a damaged file is a clear error, never a huge allocation.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

from llmrun.errors import ModelFileError, UsageError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

Imatrix = dict[str, "npt.NDArray[np.float32]"]


def read_imatrix(path: Path) -> Imatrix:
    if not path.is_file():
        raise UsageError(f"importance matrix {path} does not exist", "check the `imatrix` path")
    with path.open("rb") as handle:
        magic = handle.read(4)
    result = _read_gguf(path) if magic == b"GGUF" else _read_legacy(path)
    if not result:
        raise ModelFileError(f"{path} holds no importance data", "make it again with llama-imatrix")
    return result


def _read_gguf(path: Path) -> Imatrix:
    import numpy as np

    from llmrun.formats.gguf_header import read_header

    read_header(path)  # bounded check before the gguf package's reader
    from gguf import GGUFReader

    try:
        tensors = {t.name: t for t in GGUFReader(path).tensors}
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, MemoryError) as exc:  # past our check
        raise ModelFileError(
            f"{path} is not a valid importance matrix: {exc}", "make it again with llama-imatrix"
        ) from None
    result: Imatrix = {}
    for name, tensor in tensors.items():
        if not name.endswith(".in_sum2"):
            continue
        base = name[: -len(".in_sum2")]
        counts_tensor = tensors.get(base + ".counts")
        if counts_tensor is None:
            raise ModelFileError(f"{path}: {base} has sums but no counts", "make the file again with llama-imatrix")
        sums = np.asarray(tensor.data, dtype=np.float32).reshape(-1, int(tensor.shape[0]))
        counts = np.asarray(counts_tensor.data, dtype=np.float32).reshape(-1)
        if len(counts) != sums.shape[0]:
            raise ModelFileError(f"{path}: {base} has {len(counts)} counts for {sums.shape[0]} matrices", "")
        result[base] = (sums / np.maximum(counts, 1.0)[:, None]).astype(np.float32).ravel()
    return result


def _read_legacy(path: Path) -> Imatrix:
    import numpy as np

    data = path.read_bytes()
    offset = 0

    def take(n: int) -> bytes:
        nonlocal offset
        if n < 0 or offset + n > len(data):
            raise ModelFileError(
                f"{path} is not an importance matrix (truncated at byte {offset})",
                "pass a file made by llama-imatrix (.gguf or .dat)",
            )
        chunk = data[offset : offset + n]
        offset += n
        return chunk

    (n_entries,) = struct.unpack("<i", take(4))
    if not 0 < n_entries <= 100_000:
        raise ModelFileError(f"{path} is not an importance matrix", "pass a file made by llama-imatrix (.gguf or .dat)")
    result: Imatrix = {}
    for _ in range(n_entries):
        (name_len,) = struct.unpack("<i", take(4))
        name = take(name_len).decode("utf-8", "replace")
        ncall, nval = struct.unpack("<ii", take(8))
        values = np.frombuffer(take(4 * nval), dtype="<f4").astype(np.float32)
        result[name] = values / ncall if ncall > 0 else values
    return result
