"""The bounded GGUF header reader (files from the Hub, other stores, users): ``read_header``."""

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.formats.gguf_header import read_header


def one(data: bytes) -> None:
    path = harness.as_file(data, "model.gguf")
    header = read_header(path)
    _ = (header.architecture, header.chat_template, header.tool_use_template, header.weight_bytes)


if __name__ == "__main__":
    harness.main(one)
