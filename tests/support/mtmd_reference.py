"""llama.cpp's own ``llama-mtmd-cli``, built once per machine from the llama.cpp that the installed
llama-cpp-python's sdist vendors (``tests/support/llama_tools.py``, as the RPC tests' workers), and run as the reference
for images: the same model, projector, image and prompt must give the same greedy tokens."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.llama_tools import built

CLI = "llama-mtmd-cli"


def build(cache: Path) -> Path:
    """The built ``llama-mtmd-cli`` (its shared libraries beside it), once per machine."""
    return built(cache, "llama-mtmd", ["-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_APP=OFF"], [CLI]) / CLI


def greedy(cli: Path, model: Path, mmproj: Path, image: Path, prompt: str, n: int, n_ctx: int) -> str:
    """What ``llama-mtmd-cli`` answers, greedy, through llama.cpp's Gemma chat template (its stdout: the
    generated text, between a newline before and two after)."""
    command = [str(cli), "-m", str(model), "--mmproj", str(mmproj), "--image", str(image), "-p", prompt]
    command += ["--temp", "0", "-n", str(n), "-c", str(n_ctx), "-t", "2", "--no-warmup", "--seed", "1"]
    command += ["--chat-template", "gemma"]  # the packaged base model has none of its own
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
