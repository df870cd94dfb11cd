"""Which files of a GGUF repo make a quantization: quant names in file names, split files, the default choice."""

from __future__ import annotations

import re

from llmrun.errors import ModelNotFound

_QUANT = re.compile(r"(?i)(?<![A-Za-z0-9])(I?Q[1-8](?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])")


_SPLIT = re.compile(r"(?i)-(\d{5})-of-(\d{5})\.gguf$")


NO_GGUF = "the repo has no .gguf files"


FOUR_BIT = ("Q4_K_M", "Q4_K_S", "Q4_K_L", "Q4_0", "IQ4_XS", "IQ4_NL", "Q4_1", "Q4")


def quant_of(name: str) -> str | None:
    """The quant tag in a GGUF file name (``Qwen2.5-0.5B-Q4_K_M.gguf`` → ``Q4_K_M``)."""
    stem = _SPLIT.sub(".gguf", name)
    found = _QUANT.findall(stem.rsplit("/", 1)[-1])
    return found[-1].upper() if found else None


def gguf_groups(names: list[str]) -> dict[str, list[str]]:
    """Model GGUFs by their (unsplit) name; split parts are kept together and in order."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        lower = name.lower()
        if not lower.endswith(".gguf") or is_projector(name):
            continue
        groups.setdefault(_SPLIT.sub(".gguf", name), []).append(name)
    return groups


def choose(names: list[str], quant: str | None) -> tuple[list[str], str]:
    """The files to fetch for ``quant`` (case-insensitive), and why they were chosen.

    With no quant: Q4_K_M, else the closest 4-bit quant, else the first GGUF.
    """
    groups = gguf_groups(names)
    if not groups:
        raise ModelNotFound(NO_GGUF, "pick a GGUF repo, e.g. one whose name ends in -GGUF")
    by_quant: dict[str, list[str]] = {}
    for key, files in groups.items():
        by_quant.setdefault(quant_of(key) or key, files)
    if quant is not None:
        wanted = quant.upper()
        if wanted in by_quant:
            return by_quant[wanted], f"{wanted} as asked"
        raise ModelNotFound(f"no {wanted} file in the repo", f"available: {', '.join(sorted(by_quant))}")
    for candidate in FOUR_BIT:
        if candidate in by_quant:
            why = "the default quant" if candidate == "Q4_K_M" else "the closest 4-bit quant to Q4_K_M"
            return by_quant[candidate], f"{candidate}, {why}"
    first = sorted(by_quant)[0]
    return by_quant[first], f"{first}, the first GGUF (no 4-bit file)"


PROJECTOR_PREFERENCE = ("F16", "BF16", "Q8_0", "F32")
"""Which of a repo's projectors to fetch: F16 runs on every backend and is what llama.cpp's converter writes
by default; BF16 is as precise but not every backend computes in it; Q8_0 is smaller; F32 is twice F16's size."""


def is_projector(name: str) -> bool:
    """A vision model's projector GGUF (``mmproj-F16.gguf``, ``mmproj-model-f16.gguf``, ``x-mmproj.gguf``)."""
    lower = name.lower()
    return lower.endswith(".gguf") and "mmproj" in lower.rsplit("/", 1)[-1]


def choose_projector(names: list[str]) -> tuple[str | None, str]:
    """The projector to fetch with a model from a repo's file names (None: the repo has none), and why.

    Only files at the repo's top level count (a folder of other models' projectors is not this one's).
    """
    found = sorted(name for name in names if "/" not in name and is_projector(name))
    if not found:
        return None, "no projector in the repo"
    for wanted in PROJECTOR_PREFERENCE:
        for name in found:
            if quant_of(name) == wanted:
                return name, f"projector {name}"
    return found[0], f"projector {found[0]}"
