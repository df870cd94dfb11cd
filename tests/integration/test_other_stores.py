"""A model in an Ollama store laid out as Ollama lays it out (the packaged Gemma as the model layer,
named by its real sha256, with a parameters and a system layer): listed, run and chatted with in place,
its parameters and system prompt applied, nothing written into the store."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from llmrun.files import sha256_file
from tests.support.helpers import invoke

pytestmark = pytest.mark.slow


@pytest.fixture
def ollama_store(gemma_cache: Path, hermetic_env: Path) -> Path:
    root = Path(os.environ["OLLAMA_MODELS"])
    blobs = root / "blobs"
    blobs.mkdir(parents=True)

    def add(data_path: Path | None, text: str | None = None) -> str:
        if text is not None:
            data_path = root / "tmp-layer"
            data_path.write_text(text)
        assert data_path is not None
        digest = sha256_file(data_path)
        target = blobs / f"sha256-{digest}"
        if text is not None:
            data_path.rename(target)
        else:
            try:
                os.link(data_path, target)  # the 253 MB model, not copied
            except OSError:
                shutil.copyfile(data_path, target)
        return f"sha256:{digest}"

    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": add(gemma_cache)},
        {
            "mediaType": "application/vnd.ollama.image.params",
            "digest": add(None, json.dumps({"temperature": 0, "num_predict": 6, "num_ctx": 1024})),
        },
        {"mediaType": "application/vnd.ollama.image.system", "digest": add(None, "Answer in French.")},
    ]
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "gemma-test" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return root


def files(root: Path) -> dict[str, int]:
    return {str(p): p.lstat().st_mtime_ns for p in root.rglob("*")}


def test_list_all_run_and_show_params_in_place(ollama_store: Path) -> None:
    before = files(ollama_store)
    code, out, err = invoke(["list", "--all", "--json"])
    assert code == 0, err
    listed = {row["name"]: row for row in json.loads(out)}
    assert listed["ollama:gemma-test:latest"]["repo"] == "(Ollama)"
    code, out, err = invoke(["run", "-m", "ollama:gemma-test", "--show-params", "The capital of France is"])
    assert code == 0, err
    assert "Ollama's parameters" in err and "Answer in French." in err and "Ollama's system prompt" in err
    code, out, err = invoke(["run", "-m", "ollama:gemma-test", "--json", "The capital of France is"])
    assert code == 0, err
    report = json.loads(out)
    assert report["tokens"]["generated"] == 6  # num_predict from the params layer
    assert report["params"]["temperature"] == 0 and report["params"]["n_ctx"] == 1024
    assert report["model_path"].startswith(str(ollama_store))
    code, out, err = invoke(["run", "-m", "ollama:gemma-test", "-n", "3", "--json", "Hi"])
    assert json.loads(out)["tokens"]["generated"] == 3  # the command line still wins
    assert files(ollama_store) == before  # nothing written into Ollama's store


def test_a_tampered_blob_is_refused(ollama_store: Path, tmp_path: Path) -> None:
    manifest = ollama_store / "manifests" / "registry.ollama.ai" / "library" / "gemma-test" / "latest"
    layers = json.loads(manifest.read_text())["layers"]
    target = ollama_store / "blobs" / layers[0]["digest"].replace(":", "-")
    target.unlink()  # (a hard link: the cached model itself stays)
    target.write_bytes(b"GGUF" + b"\0" * 100)
    code, _, err = invoke(["run", "-m", "ollama:gemma-test", "hi"])
    assert code == 1 and "does not match its sha256" in err and "Traceback" not in err
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"GGUF")
    target.unlink()
    target.symlink_to(outside)
    code, _out, err = invoke(["run", "-m", "ollama:gemma-test", "hi"])
    assert code == 1 and "outside" in err
