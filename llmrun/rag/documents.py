"""Finding and reading the documents to index: text, Markdown, source code, PDF.

Directories are walked recursively (hidden entries, virtual environments and build caches
skipped); a file that is not text — NUL bytes or not UTF-8 — is skipped with a note.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llmrun.errors import UsageError

MARKDOWN = frozenset({".md", ".markdown", ".mdx", ".rst"})
_CODE = ".py .pyi .js .jsx .ts .tsx .go .rs .c .h .cc .cpp .hpp .java .kt .swift .rb .php .cs .scala .sh .bash \
.zsh .lua .r .jl .sql .html .css .scss .toml .yaml .yml .json .ini .cfg .xml .tex .m .mm .ex .exs"
CODE = frozenset(_CODE.split(" "))
SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "venv", "site-packages", "dist", "build", "target"})
SNIFF_BYTES = 8192
MAX_FILE_BYTES = 64 * 1024 * 1024  # a larger "document" is almost certainly data, not prose


@dataclass(frozen=True, slots=True)
class Document:
    path: Path  # absolute
    kind: str  # "text", "markdown", "code" or "pdf"
    unit: str  # what the chunks' numbers count: "line", or "page" for a PDF


@dataclass(frozen=True, slots=True)
class Skipped:
    path: Path
    why: str


def kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return "pdf"
    if suffix in MARKDOWN:
        return "markdown"
    return "code" if suffix in CODE else "text"


def _hidden(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts
    return any(p.startswith(".") or p in SKIPPED_DIRS for p in parts)


def find(paths: Iterable[Path]) -> tuple[list[Document], list[Skipped]]:
    """The documents under ``paths`` (files as given, directories walked), and what was skipped."""
    found: dict[Path, Document] = {}
    skipped: list[Skipped] = []
    for given in paths:
        if not given.exists():
            raise UsageError(f"no such file or directory: {given}", "check the path")
        root = given.absolute()
        if root.is_file():
            candidates = [root]
        elif root.is_dir():
            if not os.access(root, os.R_OK | os.X_OK):
                raise UsageError(f"cannot read the directory {given}: permission denied", "check its permissions")
            candidates = sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p, root))
        else:
            raise UsageError(f"{given} is not a file or a directory", "pass documents or folders of them")
        for path in candidates:
            problem = _problem(path)
            if problem and root.is_file():
                raise UsageError(f"cannot index {given}: {problem}", _hint(problem))
            if problem:
                skipped.append(Skipped(path, problem))
                continue
            kind = kind_of(path)
            found[path] = Document(path, kind, "page" if kind == "pdf" else "line")
    return list(found.values()), skipped


def _hint(problem: str) -> str:
    if "permission" in problem:
        return "check the file's permissions"
    return "index text, Markdown, source code or PDF files"


def _problem(path: Path) -> str | None:
    """Why a file cannot be indexed, or ``None``."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return exc.strerror or str(exc)
    if path.suffix.lower() == ".pdf":
        return None if head.startswith(b"%PDF-") else "not a PDF (no %PDF- header)"
    if size > MAX_FILE_BYTES:
        return f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB"
    if b"\0" in head:
        return "binary file"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the sniff boundary
            return "binary file (not UTF-8 text)"
    return None


def read_lines(document: Document) -> list[tuple[int, str]]:
    """A document as numbered lines: (line number, text), or (page number, text) for a PDF."""
    if document.kind == "pdf":
        return _pdf_lines(document.path)
    try:
        text = document.path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{document.path} is not UTF-8 text", "convert it to UTF-8") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {document.path}: {exc.strerror}", "check the file") from exc
    return list(enumerate(text.removeprefix("\ufeff").splitlines(), start=1))


def _pdf_lines(path: Path) -> list[tuple[int, str]]:
    import logging

    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its notes on odd PDFs are not the user's concern
    lines: list[tuple[int, str]] = []
    try:
        reader = PdfReader(path)
        if reader.is_encrypted:
            raise UsageError(f"{path} is an encrypted PDF", "decrypt it first (qpdf --decrypt)")
        for number, page in enumerate(reader.pages, start=1):
            text = page.extract_text() or ""
            lines.extend((number, line) for line in text.splitlines())
            lines.append((number, ""))  # a page ends a paragraph
    except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
        raise UsageError(f"cannot read the PDF {path}: {exc}", "the file may be damaged") from exc
    return lines
