"""Saved chats (`/load NAME`): a JSON file a user may have edited."""

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.engine.chat import read_saved


def one(data: bytes) -> None:
    path = harness.as_file(data, "chat.json")
    read_saved(path)


if __name__ == "__main__":
    harness.main(one)
