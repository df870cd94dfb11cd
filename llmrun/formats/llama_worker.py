"""Runs llama.cpp's quantizer in its own process: ``python -m llmrun.formats.llama_worker``.

A separate process, because a C call cannot be interrupted: Ctrl-C in the parent kills
this process and removes the partial output at once, and a crash inside llama.cpp becomes
an error message instead of taking the command down. Reports on stdout, one line each:
``tensor DONE TOTAL NAME``; llama.cpp's error lines go to stderr.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import sys
from pathlib import Path
from typing import Any

_PROGRESS = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_ERROR = 3  # GGML_LOG_LEVEL_ERROR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("dest")
    parser.add_argument("ftype", type=int)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--allow-requantize", action="store_true")
    parser.add_argument("--imatrix")
    args = parser.parse_args(argv)

    import llama_cpp

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def log(level: int, text: bytes, user_data: Any) -> None:
        line = text.decode("utf-8", "replace")
        match = _PROGRESS.match(line)
        if match:
            print(f"tensor {match[1]} {match[2]} {match[3]}", flush=True)
        elif level == _ERROR or "error" in line.lower() or "failed" in line.lower():
            sys.stderr.write(line if line.endswith("\n") else line + "\n")

    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = args.ftype
    params.nthread = args.threads
    params.allow_requantize = args.allow_requantize
    keep: list[Any] = []  # the imatrix buffers must outlive the call
    if args.imatrix:
        params.imatrix = _imatrix(Path(args.imatrix), keep)
    rc = llama_cpp.llama_model_quantize(args.source.encode(), args.dest.encode(), ctypes.byref(params))
    return 0 if rc == 0 else 1


def _imatrix(path: Path, keep: list[Any]) -> Any:
    """A NULL-terminated array of ``llama_model_imatrix_data`` for llama.cpp."""
    import llama_cpp
    import numpy as np

    from llmrun.formats.imatrix import read_imatrix

    entries = read_imatrix(path)
    array = (llama_cpp.llama_model_imatrix_data * (len(entries) + 1))()
    for i, (name, values) in enumerate(entries.items()):
        buffer = np.ascontiguousarray(values, dtype=np.float32)
        keep.append(buffer)
        array[i].name = name.encode()
        array[i].data = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        array[i].size = buffer.size
    keep.append(array)
    return ctypes.cast(array, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))


if __name__ == "__main__":
    from llmrun.errors import LlmrunError

    try:
        sys.exit(main())
    except LlmrunError as exc:
        sys.stderr.write(f"{exc.message}\n")
        sys.exit(2)
