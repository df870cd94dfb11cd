"""Changing a model's form: GGUF → MLX conversion (and, later, quantization and its quality report)."""

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
