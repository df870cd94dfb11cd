"""Importance matrices (llama-imatrix's GGUF and legacy .dat files), read for `llmrun quantize --imatrix`."""

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.formats.imatrix import read_imatrix


def one(data: bytes) -> None:
    path = harness.as_file(data, "imatrix.dat")
    read_imatrix(path)


if __name__ == "__main__":
    harness.main(one)
