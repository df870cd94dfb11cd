"""An MLX model directory: config.json, tokenizer_config.json and a safetensors header, read as a header."""

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.formats.memory import geometry
    from llmrun.formats.mlx_header import read_mlx_header


def one(data: bytes) -> None:
    folder = harness.workdir()
    parts = harness.parts(data, 3)  # config.json, tokenizer_config.json (absent when empty), safetensors
    (folder / "config.json").write_bytes(parts[0])
    if parts[1]:
        (folder / "tokenizer_config.json").write_bytes(parts[1])
    (folder / "model.safetensors").write_bytes(parts[2])
    header = read_mlx_header(folder)
    geometry(header)


if __name__ == "__main__":
    harness.main(one)
