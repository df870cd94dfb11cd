"""Ollama's store, read in place: a manifest, the blobs it names, and its params layer."""

import hashlib
import json

import atheris
import harness

with atheris.instrument_imports():
    from llmrun.models.otherstores import ollama_model, ollama_models

GGUF = b"GGUF" + bytes(20)


def one(data: bytes) -> None:
    manifest, *texts = harness.parts(data, 3)  # the manifest, then a params and a system layer
    root = harness.workdir() / "ollama"
    blobs = root / "blobs"
    blobs.mkdir(parents=True)
    digests = []
    for blob in (GGUF, *texts):
        digest = hashlib.sha256(blob).hexdigest()
        (blobs / f"sha256-{digest}").write_bytes(blob)
        digests.append(f"sha256:{digest}")
    if manifest[:1] == b"T":  # "T…": a well-formed manifest naming the fuzzed layers
        kinds = ["application/vnd.ollama.image.model", "application/vnd.ollama.image.params"]
        kinds.append("application/vnd.ollama.image.system")
        manifest = json.dumps(
            {"layers": [{"mediaType": k, "digest": d} for k, d in zip(kinds, digests, strict=True)]}
        ).encode()
    folder = root / "manifests" / "registry.ollama.ai" / "library" / "m"
    folder.mkdir(parents=True)
    (folder / "latest").write_bytes(manifest)
    list(ollama_models(root))
    ollama_model("m", root)


if __name__ == "__main__":
    harness.main(one)
