"""`llmrun batch` input: text lines or JSONL, each a prompt or a conversation with per-line settings."""

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.api import batch as batchio


def one(data: bytes) -> None:
    lines = data.decode("utf-8", "replace").splitlines(keepends=True)
    for item in batchio.parse(lines):  # as `llmrun batch` reads a file: JSONL or text, told by its first line
        if isinstance(item, batchio.Item):
            _ = (item.id, item.prompt, item.messages, item.overrides, item.response_format)


if __name__ == "__main__":
    harness.main(one)
