"""models.toml, the user's registry: parsed and validated."""

from pathlib import Path

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.models.registry import parse_registry_text


def one(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    parse_registry_text(text, Path("models.toml"))


if __name__ == "__main__":
    harness.main(one)
