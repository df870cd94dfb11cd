"""Other tools' stores, laid out in a temporary folder the way Ollama and LM Studio lay them out."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from llmrun.errors import ModelFileError, ModelNotFound
from llmrun.models.otherstores import (
    MODEL_LAYER,
    PARAMS_LAYER,
    SYSTEM_LAYER,
    lmstudio_model,
    lmstudio_models,
    ollama_model,
    ollama_models,
    ollama_parts,
)
from llmrun.models.refs import ModelRef

WEIGHTS = b"GGUF" + bytes(range(256)) * 16


def blob(root: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return f"sha256:{digest}"


def manifest(root: Path, name: str, layers: list[dict[str, object]], tag: str = "latest") -> Path:
    path = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return path


def layer(media: str, digest: str, size: int = 0) -> dict[str, object]:
    return {"mediaType": media, "digest": digest, "size": size}


@pytest.fixture
def ollama_store(tmp_path: Path, hermetic_env: Path) -> Path:
    root = tmp_path / "ollama"
    params = json.dumps({"temperature": 0.3, "stop": ["<|end|>"], "num_ctx": 2048, "num_predict": -2, "mirostat": 1})
    manifest(
        root,
        "tiny",
        [
            layer(MODEL_LAYER, blob(root, WEIGHTS), len(WEIGHTS)),
            layer(PARAMS_LAYER, blob(root, params.encode())),
            layer(SYSTEM_LAYER, blob(root, b"You are terse.")),
        ],
        tag="1b",
    )
    return root


def snapshot(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_names_default_to_library_and_latest() -> None:
    assert ollama_parts("llama3.2") == ("registry.ollama.ai", "library", "llama3.2", "latest")
    assert ollama_parts("llama3.2:3b") == ("registry.ollama.ai", "library", "llama3.2", "3b")
    assert ollama_parts("me/mine:q4") == ("registry.ollama.ai", "me", "mine", "q4")
    assert ollama_parts("host.example:5000/me/mine:q4") == ("host.example:5000", "me", "mine", "q4")
    assert ModelRef.parse("ollama:llama3.2:3b") == ModelRef("ollama", "ollama:llama3.2:3b", "llama3.2:3b")
    assert ModelRef.parse("lmstudio:pub/repo").kind == "lmstudio"


@pytest.mark.parametrize("name", ["../etc/passwd", "a/b/c/d", "x:..", "x:a/b", "./x", "x y", "..", "a/../b", ":tag"])
def test_names_with_path_tricks_are_refused(name: str) -> None:
    with pytest.raises(ModelNotFound):
        ollama_parts(name)


def test_a_model_with_its_parameters_and_system_prompt(ollama_store: Path) -> None:
    before = snapshot(ollama_store)
    found = ollama_model("tiny:1b", ollama_store)
    assert found.name == "ollama:tiny:1b" and found.source == "Ollama"
    assert found.path.read_bytes() == WEIGHTS
    assert found.defaults == {"temperature": 0.3, "stop": ("<|end|>",), "n_ctx": 2048, "max_tokens": -1}
    assert found.system == "You are terse."
    assert snapshot(ollama_store) == before  # nothing written into Ollama's store
    again = ollama_model("tiny:1b", ollama_store)  # the sha256 check is remembered (by size and mtime)
    assert again == found


def test_hostile_and_damaged_stores(ollama_store: Path) -> None:
    root = ollama_store
    with pytest.raises(ModelNotFound, match="no model"):
        ollama_model("absent", root)
    manifest(root, "missing-blob", [layer(MODEL_LAYER, "sha256:" + "a" * 64)])
    with pytest.raises(ModelFileError, match="missing its blob"):
        ollama_model("missing-blob", root)
    digest = blob(root, b"GGUF other bytes")
    hexdigest = digest.split(":")[1]
    (root / "blobs" / f"sha256-{hexdigest}").write_bytes(b"GGUF tampered!!!")  # same size, other content
    manifest(root, "tampered", [layer(MODEL_LAYER, digest)])
    with pytest.raises(ModelFileError, match="does not match its sha256"):
        ollama_model("tampered", root)
    for bad in ("sha256:../../etc/passwd", "sha256:" + "g" * 64, "md5:abc", 7):
        manifest(root, "bad-digest", [layer(MODEL_LAYER, bad)])  # type: ignore[arg-type]
        with pytest.raises(ModelFileError, match="not a sha256 digest"):
            ollama_model("bad-digest", root)
    huge = manifest(root, "huge", [])
    huge.write_bytes(b" " * (300 * 1024))
    with pytest.raises(ModelFileError, match="bytes"):
        ollama_model("huge", root)
    manifest(root, "garbage", []).write_text("{not json")
    with pytest.raises(ModelFileError, match="cannot be read"):
        ollama_model("garbage", root)
    manifest(root, "no-model", [layer(SYSTEM_LAYER, blob(root, b"hi"))])
    with pytest.raises(ModelFileError, match="no GGUF layer"):
        ollama_model("no-model", root)
    listed = {m.name: m for m in ollama_models(root)}
    assert listed["ollama:tiny:1b"].path is not None and listed["ollama:tiny:1b"].size == len(WEIGHTS)
    assert listed["ollama:missing-blob:latest"].path is None  # listed as damaged, not an error


def test_lmstudio_layout(tmp_path: Path) -> None:
    root = tmp_path / "lmstudio"
    folder = root / "pub" / "repo-GGUF"
    folder.mkdir(parents=True)
    for name in ("repo-Q8_0.gguf", "repo-Q4_K_M.gguf", "mmproj-repo-f16.gguf"):
        (folder / name).write_bytes(WEIGHTS)
    assert lmstudio_model("pub/repo-GGUF", [root]).path.name == "repo-Q4_K_M.gguf"
    assert lmstudio_model("pub/repo-GGUF/repo-Q8_0.gguf", [root]).name == "lmstudio:pub/repo-GGUF/repo-Q8_0.gguf"
    assert lmstudio_model("pub/repo-GGUF", [root]).mmproj == folder / "mmproj-repo-f16.gguf"  # kept beside it
    assert [m.name for m in lmstudio_models([root])] == [
        "lmstudio:pub/repo-GGUF/repo-Q4_K_M.gguf",
        "lmstudio:pub/repo-GGUF/repo-Q8_0.gguf",
    ]
    for bad in ("../x/y", "pub/../repo", "pub", "pub/repo/../../x.gguf"):
        with pytest.raises(ModelNotFound):
            lmstudio_model(bad, [root])
    with pytest.raises(ModelNotFound, match="no model"):
        lmstudio_model("pub/other", [root])


def test_a_gguf_another_tool_put_in_the_hugging_face_cache_runs_in_place(hermetic_env: Path) -> None:
    import os

    from llmrun.models.registry import load_registry
    from llmrun.models.resolve import resolve

    hub = Path(os.environ["HF_HOME"]) / "hub" / "models--owner--repo-GGUF"
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    (hub / "blobs").mkdir(parents=True)
    (hub / "blobs" / digest).write_bytes(WEIGHTS)
    snapshot_dir = hub / "snapshots" / ("0" * 40)
    snapshot_dir.mkdir(parents=True)
    (snapshot_dir / "model-Q4_K_M.gguf").symlink_to(hub / "blobs" / digest)
    resolved = resolve(ModelRef.parse("owner/repo-GGUF/model-Q4_K_M.gguf"), load_registry())
    assert resolved.path == snapshot_dir / "model-Q4_K_M.gguf" and resolved.foreign is not None
    (hub / "blobs" / digest).write_bytes(WEIGHTS[::-1])  # changed since: its name no longer says what it is
    with pytest.raises(ModelFileError, match="does not match its sha256"):
        resolve(ModelRef.parse("owner/repo-GGUF/model-Q4_K_M.gguf"), load_registry())
