"""GGUF → GGUF through llama.cpp's own quantizer (``llama_model_quantize``).

The quantizer runs in a child process (:mod:`llmrun.formats.llama_worker`): its tensor
lines become progress, its error lines become the error, and Ctrl-C stops it at once.
The output is staged beside the target and appears only when llama.cpp reports success.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from llmrun.errors import BackendError, UsageError
from llmrun.files import Progress
from llmrun.formats.gguf_header import GgufHeader, read_header
from llmrun.formats.memory import parameter_count
from llmrun.formats.output import check_destination, staged


@dataclass(frozen=True, slots=True)
class QuantType:
    name: str
    ftype: int  # llama_ftype
    bits: float  # about this many bits per weight (llama.cpp's quantize table)
    needs_imatrix: bool = False


QUANT_TYPES = {
    t.name: t
    for t in (
        QuantType("Q2_K", 10, 3.0),
        QuantType("Q3_K_S", 11, 3.5),
        QuantType("Q3_K_M", 12, 3.9),
        QuantType("Q3_K_L", 13, 4.3),
        QuantType("Q4_0", 2, 4.5),
        QuantType("Q4_1", 3, 5.0),
        QuantType("Q4_K_S", 14, 4.6),
        QuantType("Q4_K_M", 15, 4.9),
        QuantType("Q5_0", 8, 5.5),
        QuantType("Q5_1", 9, 6.0),
        QuantType("Q5_K_S", 16, 5.5),
        QuantType("Q5_K_M", 17, 5.7),
        QuantType("Q6_K", 18, 6.6),
        QuantType("Q8_0", 7, 8.5),
        QuantType("IQ4_NL", 25, 4.5),
        QuantType("IQ4_XS", 30, 4.3),
        QuantType("IQ3_M", 27, 3.7, True),
        QuantType("IQ3_XXS", 23, 3.1, True),
        QuantType("IQ2_M", 29, 2.7, True),
        QuantType("IQ2_XS", 20, 2.3, True),
        QuantType("IQ2_XXS", 19, 2.1, True),
        QuantType("F16", 1, 16.0),
        QuantType("BF16", 32, 16.0),
    )
}
BITS_TYPES = {4: "Q4_K_M", 8: "Q8_0"}
UNQUANTIZED = ("F32", "F16", "BF16")


def quant_type(name: str | None, bits: int | None) -> QuantType:
    """The type named by ``--type``, else by ``--bits`` (4 → Q4_K_M, 8 → Q8_0)."""
    if name is not None:
        upper = name.upper()
        if upper not in QUANT_TYPES:
            raise UsageError(f"unknown quantization type {name!r}", f"valid types: {', '.join(QUANT_TYPES)}")
        return QUANT_TYPES[upper]
    if bits is not None and bits not in BITS_TYPES:
        raise UsageError(f"`bits` must be 4 or 8, got {bits}", "or name a type with `type` (e.g. Q5_K_M)")
    return QUANT_TYPES[BITS_TYPES[bits or 4]]


def file_type(header: GgufHeader) -> str:
    """What the file is: its ``general.file_type``, else the type most of its weight bytes have."""
    named = {t.ftype: t.name for t in QUANT_TYPES.values()} | {0: "F32"}
    value = header.metadata.get("general.file_type")
    if isinstance(value, int) and value in named:
        return named[value]
    by_type: dict[str, int] = {}
    for tensor in header.tensors:
        by_type[tensor.type_name] = by_type.get(tensor.type_name, 0) + tensor.nbytes
    return max(by_type, key=lambda k: by_type[k]) if by_type else "unknown"


@dataclass(frozen=True, slots=True)
class Quantized:
    path: Path
    source_type: str
    type: str
    tensors: int
    size_bytes: int
    seconds: float


def quantize_gguf(
    source: Path,
    dest: Path,
    qtype: QuantType,
    *,
    allow_requantize: bool = False,
    imatrix: Path | None = None,
    threads: int = 0,
    force: bool = False,
    progress: Progress | None = None,
) -> Quantized:
    started = time.perf_counter()
    header = read_header(source)
    source_type = file_type(header)
    if source_type not in UNQUANTIZED and not allow_requantize:
        raise UsageError(
            f"{source.name} is already quantized ({source_type}); quantizing it again loses more quality",
            "start from an F16/BF16/F32 file (llmrun convert SRC --to gguf --type f16), or pass `allow_requantize`",
        )
    if qtype.needs_imatrix and imatrix is None:
        raise UsageError(f"{qtype.name} needs an importance matrix", "pass `imatrix` FILE (made by llama-imatrix)")
    if imatrix is not None:
        from llmrun.formats.imatrix import read_imatrix

        read_imatrix(imatrix)  # a bad file fails here, in one line, before any writing
    estimate = int(parameter_count(header) * max(qtype.bits, 6.6) / 8 * 1.1)  # embeddings often stay larger
    check_destination(dest, force, estimate, directory=False)
    with staged(dest, force, directory=False) as staging:
        _run_worker(source, staging, qtype, allow_requantize, imatrix, threads, progress)
    seconds = time.perf_counter() - started
    return Quantized(dest, source_type, qtype.name, len(header.tensors), dest.stat().st_size, seconds)


def _run_worker(
    source: Path,
    staging: Path,
    qtype: QuantType,
    allow_requantize: bool,
    imatrix: Path | None,
    threads: int,
    progress: Progress | None,
) -> None:
    command = [sys.executable, "-m", "llmrun.formats.llama_worker", str(source), str(staging), str(qtype.ftype)]
    command += ["--threads", str(threads or os.cpu_count() or 1)]
    command += ["--allow-requantize"] if allow_requantize else []
    command += ["--imatrix", str(imatrix)] if imatrix else []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            kind, _, rest = line.partition(" ")
            if kind == "tensor" and progress:
                done, total, _name = rest.split(" ", 2)
                progress(f"quantize to {qtype.name}", int(done), int(total))
        _, errors = process.communicate()
    except BaseException:
        process.kill()
        process.wait()
        raise
    if process.returncode != 0:
        lines = [line.strip() for line in errors.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"exit status {process.returncode}"
        raise BackendError(f"llama.cpp could not quantize {source.name}: {reason}", "run with `debug` for details")
