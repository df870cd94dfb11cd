"""Model names as users type them, parsed into a :class:`ModelRef` (pure, no I/O).

Accepted forms:

* ``alias[:tag]``                 an entry of models.toml, e.g. ``gemma3:270m``
* ``owner/repo[:quant]``          a Hugging Face repo (``hf.co/`` prefix allowed)
* ``owner/repo/file.gguf``        one file of a repo
* a path                          ``./model.gguf``, ``/abs/model.gguf``, ``~/m.gguf``
* ``ollama:name[:tag]``           a model in Ollama's store (:mod:`llmrun.models.otherstores`)
* ``lmstudio:publisher/repo[/file.gguf]``  a model in LM Studio's

A name never becomes a path by itself: only a name that looks like a path
(starts with ``/``, ``./``, ``../``, ``~`` or ends in ``.gguf`` with no repo
shape) is treated as one, and aliases and repo names are checked for path tricks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from llmrun.errors import ModelNotFound, UsageError

Kind = Literal["alias", "hub", "path", "ollama", "lmstudio"]
STORES: tuple[Kind, ...] = ("ollama", "lmstudio")  # other tools' stores, named by their prefix

_ALIAS = re.compile(r"^[a-z0-9][a-z0-9._-]*(:[a-z0-9][a-z0-9._-]*)?$")
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_QUANT = re.compile(r"^[A-Za-z0-9_]+$")


@dataclass(frozen=True, slots=True)
class ModelRef:
    kind: Kind
    text: str  # what the user typed
    name: str  # alias (lower case), "owner/repo", or the path as given
    tag: str | None = None  # alias tag or quant
    file: str | None = None  # a file inside a hub repo

    def canonical(self) -> str:
        """The name as llmrun writes it: it parses back to this reference (``hf.co/`` dropped,
        aliases lower case, quant tags upper case)."""
        if self.kind in STORES:
            return f"{self.kind}:{self.name}"
        if self.kind == "hub" and self.file is not None:
            return f"{self.name}/{self.file}"
        if self.kind == "hub" and self.tag is not None:
            return f"{self.name}:{self.tag}"
        return self.name

    @staticmethod
    def parse(text: str) -> ModelRef:
        raw = text.strip()
        if not raw:
            raise UsageError("the model name is empty", "pass -m NAME, e.g. -m gemma3:270m")
        if "\x00" in raw or any(ord(c) < 32 for c in raw):
            raise UsageError(f"the model name {raw!r} contains control characters", "check the name")
        store, colon, rest = raw.partition(":")
        if colon and store.lower() in STORES and rest.strip():
            return ModelRef(store.lower(), raw, rest.strip())  # type: ignore[arg-type]
        if _looks_like_path(raw):
            return ModelRef("path", raw, raw)
        lowered = raw.lower()
        if _ALIAS.match(lowered) and "/" not in raw:
            _, _, tag = lowered.partition(":")
            return ModelRef("alias", raw, lowered, tag or None)
        return _parse_hub(raw)


def _looks_like_path(raw: str) -> bool:
    if raw.startswith(("/", "./", "../", "~", ".\\")) or raw in (".", ".."):
        return True
    if re.match(r"^[A-Za-z]:[\\/]", raw):  # a Windows drive path
        return True
    # a bare file name like model.gguf (no repo shape: owner/repo/file has two slashes)
    return raw.lower().endswith(".gguf") and raw.count("/") != 2


def _parse_hub(raw: str) -> ModelRef:
    body = raw
    for prefix in ("https://huggingface.co/", "hf.co/", "huggingface.co/"):
        if body.lower().startswith(prefix):
            body = body[len(prefix) :]
            break
    quant = None
    if ":" in body:
        body, quant = body.rsplit(":", 1)
        if not _QUANT.match(quant):
            raise ModelNotFound(f"{raw!r}: {quant!r} is not a quant tag", "use e.g. owner/repo:Q4_K_M")
        quant = quant.upper()
    parts = body.split("/")
    if len(parts) not in (2, 3) or not all(_REPO_PART.match(p) for p in parts) or ".." in parts:
        raise ModelNotFound(
            f"{raw!r} is not a model name",
            "use an alias from models.toml (gemma3:270m), owner/repo[:quant], "
            "owner/repo/file.gguf, or a path to a .gguf file",
        )
    if len(parts) == 3:
        if quant is not None or not parts[2].lower().endswith(".gguf"):
            raise ModelNotFound(f"{raw!r}: the third part must be a .gguf file name", "owner/repo/file.gguf")
        return ModelRef("hub", raw, f"{parts[0]}/{parts[1]}", None, parts[2])
    return ModelRef("hub", raw, body, quant)
