"""File formats: GGUF, MLX and safetensors headers, readers and writers (conversion, quantization),
the header cache and the memory plan."""

from __future__ import annotations


def code_version(*modules: str) -> str:
    """A digest of these modules' sources (file names in this package): what a converted model is
    keyed on, so that a change to the conversion code converts again."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    for name in modules:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:12]
