"""llama.cpp's own ``llama-mtmd-cli``, built once per machine from the llama.cpp that the installed
llama-cpp-python's sdist vendors (as the RPC tests build their workers), and run as the reference
for images: the same model, projector, image and prompt must give the same greedy tokens."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

from llmrun.backends.llama_build import BUILD_CMAKE
from tests.support.rpc_workers import _sdist

CLI = "llama-mtmd-cli"


def build(cache: Path) -> Path:
    """The built ``llama-mtmd-cli`` (its shared libraries beside it), once per machine."""
    from filelock import FileLock

    version_ = version("llama-cpp-python")
    flags = hashlib.sha256(BUILD_CMAKE.read_bytes()).hexdigest()[:12]
    target = cache / f"llama-mtmd-{version_}-{flags}"
    with FileLock(str(target) + ".lock"):
        cli = target / "build" / "bin" / CLI
        if cli.is_file():
            return cli
        shutil.rmtree(target, ignore_errors=True)
        source = _sdist(version_, target / "sdist") / "vendor" / "llama.cpp"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", str(source), "-B", str(target / "build"), *generator]
        configure += ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TOOLS=ON"]
        configure += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
        configure += ["-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", f"-DCMAKE_PROJECT_INCLUDE={BUILD_CMAKE}"]
        jobs = str(os.cpu_count() or 2)
        for command in (configure, ["cmake", "--build", str(target / "build"), "-j", jobs, "--target", CLI]):
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            assert done.returncode == 0, (
                f"{' '.join(command[:3])} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        shutil.rmtree(target / "sdist", ignore_errors=True)
        return cli


def greedy(cli: Path, model: Path, mmproj: Path, image: Path, prompt: str, n: int, n_ctx: int) -> str:
    """What ``llama-mtmd-cli`` answers, greedy, through llama.cpp's Gemma chat template (its stdout: the
    generated text, between a newline before and two after)."""
    command = [str(cli), "-m", str(model), "--mmproj", str(mmproj), "--image", str(image), "-p", prompt]
    command += ["--temp", "0", "-n", str(n), "-c", str(n_ctx), "-t", "2", "--no-warmup", "--seed", "1"]
    command += ["--chat-template", "gemma"]  # the packaged base model has none of its own
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
