"""Models other tools downloaded, run where they are (read-only: llmrun never writes into another store).

- **Ollama** (``$OLLAMA_MODELS``, else ``~/.ollama/models``): ``manifests/<registry>/<namespace>/<name>/<tag>``
  is a JSON manifest listing layers by digest — the GGUF (``application/vnd.ollama.image.model``), the
  parameters (``…params``, JSON), the system prompt (``…system``) — stored as ``blobs/sha256-<hex>``.
  ``ollama:llama3.2:3b`` is ``registry.ollama.ai/library/llama3.2:3b``; the tag defaults to ``latest``.
- **LM Studio** (``$LMSTUDIO_MODELS``, else ``~/.lmstudio/models``, ``~/.cache/lm-studio/models``):
  ``<publisher>/<repo>/<file>.gguf``; ``lmstudio:publisher/repo`` (its one GGUF, or the Q4_K_M one) or
  ``lmstudio:publisher/repo/file.gguf``.

Everything read here is untrusted: names and digests are checked before they touch a path, manifests
are size-bounded, a blob's sha256 is checked against its digest once (remembered in llmrun's own store
by size and mtime), and nothing outside the store's folder is read.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmrun.errors import ModelFileError, ModelNotFound

OLLAMA_REGISTRY = "registry.ollama.ai"
MAX_MANIFEST = 256 * 1024
MAX_TEXT_LAYER = 1024 * 1024
MODEL_LAYER = "application/vnd.ollama.image.model"
PROJECTOR_LAYER = "application/vnd.ollama.image.projector"  # a vision model's mmproj GGUF
PARAMS_LAYER = "application/vnd.ollama.image.params"
SYSTEM_LAYER = "application/vnd.ollama.image.system"
_PART = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")
_HOST = re.compile(r"^[a-z0-9][a-z0-9.-]{0,252}(:[0-9]{1,5})?$")
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")
# Ollama's parameters → llmrun's (sampling fields, and n_ctx for the load)
OLLAMA_PARAMS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "num_predict": "max_tokens",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "num_ctx": "n_ctx",
}


@dataclass(frozen=True, slots=True)
class ForeignModel:
    """A model in another tool's store: its GGUF, and the defaults that store keeps with it."""

    name: str  # as llmrun names it: ollama:llama3.2:3b, lmstudio:publisher/repo/file.gguf
    path: Path
    source: str  # "Ollama", "LM Studio"
    sha256: str | None = None  # the digest the store names the file by (Ollama)
    size: int = 0
    defaults: dict[str, Any] = field(default_factory=dict)  # sampling fields (and n_ctx)
    system: str | None = None
    mmproj: Path | None = None  # a vision model's projector (Ollama's projector layer), used in place


# --- Ollama ------------------------------------------------------------------------------------


def ollama_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def ollama_parts(name: str) -> tuple[str, str, str, str]:
    """``[host/][namespace/]name[:tag]`` → (host, namespace, name, tag), every part checked (no paths)."""
    text = name.strip().lower()
    colon = text.rfind(":")
    body, tag = (text[:colon], text[colon + 1 :]) if colon > text.rfind("/") else (text, "")
    parts = body.split("/")
    if len(parts) == 1:
        parts = [OLLAMA_REGISTRY, "library", *parts]
    elif len(parts) == 2:
        parts = [OLLAMA_REGISTRY, *parts]
    tag = tag or "latest"
    bad = len(parts) != 3 or not _HOST.match(parts[0]) or ".." in parts[0]
    bad = bad or not all(_PART.match(p) and p not in (".", "..") for p in (*parts[1:], tag))
    if bad:
        raise ModelNotFound(
            f"ollama:{name} is not an Ollama model name", "use ollama:NAME[:TAG], e.g. ollama:llama3.2:3b"
        )
    return parts[0], parts[1], parts[2], tag


def ollama_model(name: str, root: Path | None = None) -> ForeignModel:
    """``ollama:NAME`` as a runnable model: its GGUF blob (checked against its digest) and defaults."""
    root = root or ollama_dir()
    host, namespace, model, tag = ollama_parts(name)
    manifest_path = root / "manifests" / host / namespace / model / tag
    manifest = _manifest(manifest_path, name)
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise ModelFileError(f"the Ollama manifest of {name} has no layers", f"re-pull it: ollama pull {name}")
    by_type: dict[str, dict[str, Any]] = {}
    for layer in layers:
        if isinstance(layer, dict) and isinstance(layer.get("mediaType"), str):
            by_type.setdefault(layer["mediaType"], layer)
    if MODEL_LAYER not in by_type:
        raise ModelFileError(f"the Ollama model {name} has no GGUF layer", "it may be a cloud or adapter-only model")
    hexdigest, path = _blob(root, by_type[MODEL_LAYER], name)
    if not named_rightly(path, hexdigest):
        raise ModelFileError(
            f"the Ollama blob of {name} does not match its sha256 digest (damaged or changed)",
            f"re-pull it: ollama pull {name}",
        )
    defaults = _params(_text_blob(root, by_type.get(PARAMS_LAYER), name)) if PARAMS_LAYER in by_type else {}
    system = _text_blob(root, by_type.get(SYSTEM_LAYER), name) if SYSTEM_LAYER in by_type else None
    display = f"ollama:{model}:{tag}" if (host, namespace) == (OLLAMA_REGISTRY, "library") else f"ollama:{name}"
    projector = None
    if PROJECTOR_LAYER in by_type:
        projector_digest, projector = _blob(root, by_type[PROJECTOR_LAYER], name)
        if not named_rightly(projector, projector_digest):
            raise ModelFileError(
                f"the Ollama projector blob of {name} does not match its sha256 digest (damaged or changed)",
                f"re-pull it: ollama pull {name}",
            )
    size = path.stat().st_size
    return ForeignModel(display, path, "Ollama", hexdigest, size, defaults, system or None, projector)


def _manifest(path: Path, name: str) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST:
            raise ModelFileError(f"the Ollama manifest of {name} is {size} bytes", "it is not a manifest Ollama wrote")
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ModelNotFound(
            f"Ollama has no model {name} (no manifest in {path.parents[3]})",
            "`llmrun list --all` shows what Ollama has; set OLLAMA_MODELS if its store is elsewhere",
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelFileError(
            f"the Ollama manifest of {name} cannot be read: {exc}", f"re-pull it: ollama pull {name}"
        ) from None
    if not isinstance(value, dict):
        raise ModelFileError(f"the Ollama manifest of {name} is not a JSON object", f"re-pull it: ollama pull {name}")
    return value


def _blob(root: Path, layer: dict[str, Any], name: str) -> tuple[str, Path]:
    digest = layer.get("digest")
    match = _DIGEST.match(digest) if isinstance(digest, str) else None
    if match is None:
        raise ModelFileError(
            f"the Ollama manifest of {name} names a layer {digest!r}, not a sha256 digest", "re-pull it"
        )
    hexdigest = match.group(1)
    path = root / "blobs" / f"sha256-{hexdigest}"
    if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
        raise ModelFileError(f"the Ollama blob of {name} links outside the store ({path.resolve()})", "re-pull it")
    if not path.is_file():
        raise ModelFileError(
            f"the Ollama model {name} is missing its blob sha256-{hexdigest[:12]}…", f"ollama pull {name}"
        )
    return hexdigest, path


def named_rightly(path: Path, hexdigest: str) -> bool:
    """Whether a blob another store names by its sha256 is that (hashed once; remembered in llmrun's own
    store by size and mtime)."""
    from llmrun.models.store import checked_once
    from llmrun.paths import store_dir

    return checked_once(path, hexdigest, store_dir() / "foreign" / "checks" / f"{hexdigest}.json")


def _text_blob(root: Path, layer: dict[str, Any] | None, name: str) -> str:
    if layer is None:
        return ""
    _, path = _blob(root, layer, name)
    if path.stat().st_size > MAX_TEXT_LAYER:
        raise ModelFileError(f"a text layer of the Ollama model {name} is over {MAX_TEXT_LAYER} bytes", "re-pull it")
    return path.read_text(encoding="utf-8", errors="replace")


def _params(text: str) -> dict[str, Any]:
    """Ollama's params layer (JSON) as llmrun's field names; what llmrun has no field for is left out."""
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    out: dict[str, Any] = {}
    for key, item in value.items():
        target = OLLAMA_PARAMS.get(key)
        if target == "stop":
            stops = [item] if isinstance(item, str) else item
            if isinstance(stops, list) and all(isinstance(s, str) and s for s in stops):
                out["stop"] = tuple(stops)
        elif target is not None and isinstance(item, (int, float)) and not isinstance(item, bool):
            out[target] = item
    if out.get("max_tokens") in (-2, 0):
        out["max_tokens"] = -1
    return out


@dataclass(frozen=True, slots=True)
class Listed:
    """A model another store holds, as ``llmrun list --all`` shows it (nothing hashed, nothing loaded)."""

    name: str
    source: str
    path: Path | None  # None: its manifest or blob is missing or damaged
    size: int = 0
    modified: float = 0.0


def ollama_models(root: Path | None = None) -> Iterator[Listed]:
    """The models in Ollama's store, from its manifests (``ollama:NAME:TAG``)."""
    root = root or ollama_dir()
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(manifests.glob("*/*/*/*")):
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        if not manifest.is_file() or manifest.is_symlink():
            continue
        short = (host, namespace) == (OLLAMA_REGISTRY, "library")
        name = f"ollama:{model}:{tag}" if short else f"ollama:{host}/{namespace}/{model}:{tag}"
        try:
            layers = _manifest(manifest, name[7:]).get("layers")
            layers = layers if isinstance(layers, list) else []
            layer = next(x for x in layers if isinstance(x, dict) and x.get("mediaType") == MODEL_LAYER)
            _, path = _blob(root, layer, name)
            stat = path.stat()
            yield Listed(name, "Ollama", path, stat.st_size, manifest.stat().st_mtime)
        except (ModelFileError, ModelNotFound, StopIteration, OSError):
            yield Listed(name, "Ollama", None)


def huggingface_ggufs() -> Iterator[Listed]:
    """GGUF files other tools pulled into the Hugging Face cache (``owner/repo/file.gguf``)."""
    from llmrun.models.hub import cache_dir

    hub = cache_dir()
    if not hub.is_dir():
        return
    for path in sorted(hub.glob("models--*--*/snapshots/*/*.gguf")):
        owner, _, repo = path.parents[2].name.removeprefix("models--").partition("--")
        if path.is_file():
            stat = path.stat()
            yield Listed(f"{owner}/{repo}/{path.name}", "Hugging Face cache", path, stat.st_size, stat.st_mtime)


def huggingface_model(key: str) -> ForeignModel | None:
    """``owner/repo/file.gguf`` as another tool left it in the Hugging Face cache (None: not there), checked
    against the sha256 its cache blob is named by."""
    from llmrun.models.hub import cache_dir

    owner, _, rest = key.partition("/")
    repo, _, file = rest.partition("/")
    for path in sorted((cache_dir() / f"models--{owner}--{repo}").glob(f"snapshots/*/{glob.escape(file)}")):
        if not path.is_file():
            continue
        blob = path.resolve()
        if re.fullmatch(r"[0-9a-f]{64}", blob.name) and not named_rightly(blob, blob.name):
            raise ModelFileError(
                f"the cached file of {key} does not match its sha256 (damaged)", f"pull it again: {key}"
            )
        projector = beside(path)
        if projector is not None:
            kept = projector.resolve()
            if re.fullmatch(r"[0-9a-f]{64}", kept.name) and not named_rightly(kept, kept.name):
                raise ModelFileError(
                    f"the cached projector {projector.name} beside {key} does not match its sha256 (damaged)",
                    f"pull it again: {key}",
                )
        return ForeignModel(key, path, "Hugging Face cache", size=path.stat().st_size, mmproj=projector)
    return None


def beside(model: Path) -> Path | None:
    """The projector kept in the model file's own folder (LM Studio's and the Hugging Face cache's way of
    keeping a vision model's mmproj GGUF), chosen as pull chooses one; None: there is none."""
    from llmrun.models.quants import choose_projector

    names = [p.name for p in model.parent.glob("*.gguf") if p.is_file() and p != model]
    chosen, _ = choose_projector(names)
    return model.parent / chosen if chosen else None


# --- LM Studio -----------------------------------------------------------------------------------


_LMSTUDIO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def lmstudio_dirs() -> list[Path]:
    """LM Studio's model folders: ``$LMSTUDIO_MODELS`` when set, else where its versions keep them."""
    home = Path.home()
    given = os.environ.get("LMSTUDIO_MODELS")
    candidates = (
        [Path(given).expanduser()]
        if given
        else [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    )
    return [d for d in candidates if d.is_dir()]


def lmstudio_model(name: str, roots: list[Path] | None = None) -> ForeignModel:
    parts = name.strip().split("/")
    if (
        len(parts) not in (2, 3)
        or not all(re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", p) for p in parts)
        or ".." in parts
    ):
        raise ModelNotFound(
            f"lmstudio:{name} is not an LM Studio model name", "use lmstudio:PUBLISHER/REPO[/FILE.gguf]"
        )
    for root in roots if roots is not None else lmstudio_dirs():
        folder = root / parts[0] / parts[1]
        if not folder.is_dir():
            continue
        files = sorted(p for p in folder.glob("*.gguf") if p.is_file() and "mmproj" not in p.name.lower())
        if len(parts) == 3:
            files = [p for p in files if p.name == parts[2]]
        elif len(files) > 1:
            files = [p for p in files if "q4_k_m" in p.name.lower()] or files[:1]
        if files:
            path = files[0]
            return ForeignModel(
                f"lmstudio:{parts[0]}/{parts[1]}/{path.name}",
                path,
                "LM Studio",
                size=path.stat().st_size,
                mmproj=beside(path),
            )
    raise ModelNotFound(f"LM Studio has no model {name}", "`llmrun list --all` shows what LM Studio has")


def lmstudio_models(roots: list[Path] | None = None) -> Iterator[Listed]:
    for root in roots if roots is not None else lmstudio_dirs():
        for path in sorted(root.glob("*/*/*.gguf")):
            if path.is_file() and "mmproj" not in path.name.lower():
                stat = path.stat()
                name = f"lmstudio:{path.relative_to(root).as_posix()}"
                yield Listed(name, "LM Studio", path, stat.st_size, stat.st_mtime)
