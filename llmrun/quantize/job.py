"""``llmrun quantize`` as one function: find the source, choose the route, write, register.

Routes (source → target):

* GGUF → GGUF: llama.cpp's quantizer (:mod:`llmrun.formats.gguf_quantize`);
* GGUF → MLX: the converter (:mod:`llmrun.formats.convert`), quantizing with MLX;
* safetensors directory → MLX: mlx-lm's quantization (:mod:`llmrun.formats.mlx_quantize`);
* safetensors directory → GGUF: an F16 GGUF written with the ``gguf`` package
  (:mod:`llmrun.formats.hf_gguf`), then llama.cpp's quantizer.

The result is recorded in the local store under a name, so ``llmrun run -m NAME`` works
at once. The reference for the quality report is the source itself (for a safetensors
directory going to GGUF, its F16 GGUF, kept until the caller is done with it).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llmrun.errors import UsageError
from llmrun.files import Progress
from llmrun.models.quants import quant_of
from llmrun.models.refs import ModelRef
from llmrun.models.registry import Registry
from llmrun.paths import store_dir

FORMATS = ("gguf", "mlx")


@dataclass(frozen=True, slots=True)
class Request:
    source: str
    bits: int | None = None
    type: str | None = None
    format: str | None = None  # None: the source's own format family (GGUF → gguf, directory → mlx)
    group_size: int | None = None
    output: Path | None = None
    name: str | None = None
    force: bool = False
    allow_requantize: bool = False
    imatrix: Path | None = None
    threads: int = 0


@dataclass(frozen=True, slots=True)
class Source:
    name: str  # what the user called it
    base: str  # the stem default names are built from
    path: Path
    kind: str  # gguf | dir


@dataclass(frozen=True, slots=True)
class Outcome:
    name: str  # the store name it was registered under
    path: Path
    format: str
    type: str  # Q4_K_M, mlx 4-bit, …
    source: Source
    reference: Path  # what the quality report compares against
    seconds: float
    notes: tuple[str, ...]


def find_source(text: str, registry: Registry, progress: Progress | None) -> Source:
    """A GGUF (a file, a registry model, a Hub GGUF, a model made here) or a safetensors directory."""
    from llmrun.models.resolve import resolve

    ref = ModelRef.parse(text)
    path = Path(ref.name).expanduser() if ref.kind == "path" else None
    if path is not None and path.is_dir():
        from llmrun.formats.mlx_quantize import read_config

        read_config(path)  # a non-model directory fails here, in one line
        return Source(text, _stem(path.name), path, "dir")
    if ref.kind == "hub" and ref.file is None:
        return _hub_source(ref, registry, progress)
    resolved = resolve(ref, registry, progress, "gguf")
    kind = "dir" if resolved.path.is_dir() else "gguf"
    base = resolved.name if ref.kind != "path" else _stem(resolved.path.stem)
    if ref.kind in ("ollama", "lmstudio"):  # ollama:llama3.2:3b → llama3.2-3b (a name for llmrun's store)
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", ref.name.rsplit("/", 1)[-1].removesuffix(".gguf")).strip("-")
    return Source(resolved.name, _stem(base), resolved.path, kind)


def _hub_source(ref: ModelRef, registry: Registry, progress: Progress | None) -> Source:
    """A Hub repo: its GGUF when it has one, else its safetensors, pulled as a directory."""
    from llmrun.errors import ModelNotFound
    from llmrun.models import pull
    from llmrun.models.quants import NO_GGUF
    from llmrun.models.resolve import resolve

    base = _stem(ref.name.rsplit("/", 1)[-1])
    try:
        resolved = resolve(ref, registry, progress, "gguf")
        return Source(resolved.name, base, resolved.path, "dir" if resolved.path.is_dir() else "gguf")
    except ModelNotFound as exc:
        if exc.message != NO_GGUF:
            raise
    path, _ = pull.fetch_mlx(f"{ref.name}:safetensors", ref.name, progress=progress)
    return Source(ref.name, base, path, "dir")


def _stem(name: str) -> str:
    """A name without its quant or precision tag (``gemma-3-270m-F16`` → ``gemma-3-270m``)."""
    tag = quant_of(name + ".gguf")
    if tag:
        name = re.sub(rf"(?i)[-_.]?{re.escape(tag)}$", "", name) or name
    name = re.sub(r"(?i)[-_.](bf16|fp16|f16|f32|16bit|mlx|mlx-16bit|mlx-bf16)$", "", name) or name
    return name


def target_format(request: Request, source: Source) -> str:
    fmt = request.format or ("gguf" if source.kind == "gguf" else "mlx")
    if fmt not in FORMATS:
        raise UsageError(f"`format` must be gguf or mlx, got {fmt!r}", "")
    if fmt == "mlx" and request.type is not None:
        raise UsageError("`type` names a GGUF quantization type", "for MLX use `bits` 4 or 8 (and `group_size`)")
    if fmt == "gguf" and request.group_size is not None:
        raise UsageError("`group_size` applies to MLX quantization", "for GGUF choose a type with `type`")
    if fmt == "mlx" and (request.imatrix or request.allow_requantize):
        raise UsageError("`imatrix` and `allow_requantize` apply to GGUF quantization", "drop them for `format` mlx")
    return fmt


def store_name(name: str | None, default: str, registry: Registry, force: bool) -> str:
    """The name to register: ``--name``, else the default; a registry alias or a pulled model is
    never replaced, and a model made here only with ``--force``."""
    from llmrun.models.pull import LOCAL
    from llmrun.models.store import read_index

    chosen = (name or re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9._:-]+", "-", default.lower())).strip("-.")).strip()
    ref = ModelRef.parse(chosen)
    if ref.kind != "alias":
        raise UsageError(f"`name` {chosen!r} is not a model name", "use letters, digits, '.', '_', '-' and one ':'")
    if registry.get(ref.name) is not None:
        raise UsageError(f"{ref.name} is a model in models.toml", "choose another `name`")
    existing = read_index().get(ref.name)
    if existing is not None and existing.get("origin") != LOCAL:
        raise UsageError(f"{ref.name} is a pulled model in the local store", "choose another `name`")
    if existing is not None and not force:
        raise UsageError(f"{ref.name} is already in the local store", "choose another `name`, or pass `force`")
    return ref.name


def default_output(name: str, fmt: str) -> Path:
    safe = name.replace(":", "-")
    return store_dir() / "made" / (f"{safe}.gguf" if fmt == "gguf" else safe)


@contextmanager
def quantize(request: Request, registry: Registry, progress: Progress | None = None) -> Iterator[Outcome]:
    """Write and register the quantized model; any intermediate file lives until the block ends."""
    source = find_source(request.source, registry, progress)
    fmt = target_format(request, source)
    if fmt == "gguf":
        from llmrun.formats.gguf_quantize import quant_type

        qtype = quant_type(request.type, request.bits)
        tag = qtype.name
        suffix = tag.lower()
    else:
        bits = request.bits or 4
        tag, suffix = f"mlx {bits}-bit", f"mlx-{bits}bit"
    name = store_name(request.name, f"{source.base}-{suffix}", registry, request.force)
    dest = request.output or default_output(name, fmt)
    if dest.absolute().resolve() == source.path.absolute().resolve():
        raise UsageError("the output would replace the source", "choose another -o")
    with tempfile.TemporaryDirectory(prefix=".llmrun-f16-", dir=_existing_parent(dest)) as scratch:
        outcome = _write(request, source, fmt, name, tag, dest, Path(scratch), progress)
        from llmrun.models.pull import register_local

        register_local(name, outcome.path, fmt, source=source.name, source_path=source.path, quant=tag)
        yield outcome


def _existing_parent(dest: Path) -> Path:
    parent = dest.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def _write(
    request: Request,
    source: Source,
    fmt: str,
    name: str,
    tag: str,
    dest: Path,
    scratch: Path,
    progress: Progress | None,
) -> Outcome:
    notes: list[str] = []
    reference = source.path
    if fmt == "gguf":
        from llmrun.formats.gguf_quantize import quant_type, quantize_gguf

        gguf_source = source.path
        if source.kind == "dir":
            from llmrun.formats.hf_gguf import hf_to_gguf

            gguf_source = scratch / "f16.gguf"
            hf_to_gguf(source.path, gguf_source, progress=progress)
            reference = gguf_source
            notes.append(f"wrote an F16 GGUF from {source.path} first (the report's reference)")
        result = quantize_gguf(
            gguf_source,
            dest,
            quant_type(request.type, request.bits),  # as quantize() chose it, from the request
            allow_requantize=request.allow_requantize,
            imatrix=request.imatrix,
            threads=request.threads,
            force=request.force,
            progress=progress,
        )
        if result.source_type not in ("F16", "BF16", "F32"):
            notes.append(f"requantized from {result.source_type}: the report compares against that, not the original")
        return Outcome(name, dest, fmt, tag, source, reference, result.seconds, tuple(notes))
    bits = request.bits or 4
    group = request.group_size or 64
    if source.kind == "gguf":
        from llmrun.formats.convert import gguf_to_mlx

        if bits not in (4, 8):
            raise UsageError(f"`bits` must be 4 or 8, got {bits}", "for a 16-bit MLX model use llmrun convert")
        converted = gguf_to_mlx(source.path, dest, bits=bits, group_size=group, force=request.force, progress=progress)
        return Outcome(name, dest, fmt, tag, source, reference, converted.seconds, tuple(notes))
    from llmrun.formats.mlx_quantize import quantize_mlx

    done = quantize_mlx(source.path, dest, bits=bits, group_size=group, force=request.force, progress=progress)
    return Outcome(name, dest, fmt, tag, source, reference, done.seconds, tuple(notes))
