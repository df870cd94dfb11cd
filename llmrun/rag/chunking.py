"""Splitting a document into token-sized chunks on its natural boundaries (pure functions).

A document arrives as numbered lines (line numbers, or page numbers for a PDF). Lines are
grouped into blocks — paragraphs, Markdown sections, fenced code, code separated by blank
lines — and blocks are packed greedily into chunks of at most ``max_tokens``. A block too big
for one chunk is split by lines, a line too big by sentences, a sentence too big by words.
Each new chunk starts with the last pieces of the previous one, up to ``overlap`` tokens.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

Counter = Callable[[str], int]  # text → tokens, as the embedding model counts them

_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+")


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str
    start: int  # first line (or page) it covers, 1-based
    end: int  # last line (or page)
    unit: str = "line"  # "line" or "page"

    @property
    def hash(self) -> str:
        return content_hash(self.text)

    @property
    def location(self) -> str:
        return location(self.start, self.end, self.unit)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def location(start: int, end: int, unit: str) -> str:
    """``lines 3-10``, ``line 4``, ``pages 2-3``."""
    if start == end:
        return f"{unit} {start}"
    return f"{unit}s {start}-{end}"


@dataclass(frozen=True, slots=True)
class _Piece:
    text: str
    first: int  # line (or page) numbers
    last: int
    tokens: int
    starts_section: bool = False  # a Markdown heading: a good place for a new chunk
    joined: bool = False  # continues the previous piece's line (a sentence after a sentence)
    new_block: bool = False  # begins a paragraph, section or code block


def blocks(lines: Sequence[tuple[int, str]], kind: str) -> list[list[tuple[int, str]]]:
    """Group numbered lines into blocks: blank lines end a block; in Markdown a heading starts
    one and a fenced code block stays whole."""
    result: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    in_fence = False
    for number, line in lines:
        if kind == "markdown" and _FENCE.match(line):
            if not in_fence and current:
                result.append(current)
                current = []
            in_fence = not in_fence
            current.append((number, line))
            continue
        if in_fence:
            current.append((number, line))
            continue
        if not line.strip():
            if current:
                result.append(current)
                current = []
            continue
        if kind == "markdown" and _HEADING.match(line) and current:
            result.append(current)
            current = []
        current.append((number, line))
    if current:
        result.append(current)
    return result


def _split_text(text: str, count: Counter, max_tokens: int) -> Iterator[str]:
    """A line too long for a chunk, in sentences (a sentence too long: in words, then characters)."""
    parts = _SENTENCE_END.split(text)
    if len(parts) == 1:
        if count(text) <= max_tokens:
            yield text
            return
        words = text.split(" ")
        if len(words) == 1:  # one unbroken run: halve it
            middle = len(text) // 2
            yield from _split_text(text[:middle], count, max_tokens)
            yield from _split_text(text[middle:], count, max_tokens)
            return
        current = ""
        for word in words:
            candidate = f"{current} {word}" if current else word
            if current and count(candidate) > max_tokens:
                yield from _split_text(current, count, max_tokens)
                current = word
            else:
                current = candidate
        if current:
            yield from _split_text(current, count, max_tokens)
        return
    for part in parts:
        if part:
            yield from _split_text(part, count, max_tokens)


def _pieces(block: list[tuple[int, str]], count: Counter, max_tokens: int, kind: str) -> list[_Piece]:
    """A block as one piece when it fits, else its lines (long lines split into sentences)."""
    text = "\n".join(line for _, line in block)
    heading = kind == "markdown" and bool(_HEADING.match(block[0][1]))
    tokens = count(text)
    if tokens <= max_tokens:
        return [_Piece(text, block[0][0], block[-1][0], tokens, heading, new_block=True)]
    pieces: list[_Piece] = []
    for number, line in block:
        parts = [line] if count(line) <= max_tokens else list(_split_text(line, count, max_tokens))
        for i, part in enumerate(parts):
            first = not pieces
            pieces.append(_Piece(part, number, number, count(part), heading and first, i > 0, first))
    return pieces


def chunk_lines(
    lines: Sequence[tuple[int, str]],
    count: Counter,
    max_tokens: int = 256,
    overlap: int = 32,
    kind: str = "text",
    unit: str = "line",
) -> list[Chunk]:
    """Pack a document's blocks into chunks of at most ``max_tokens`` (as ``count`` measures)."""
    if max_tokens < 8:
        raise ValueError("max_tokens must be at least 8")
    overlap = max(0, min(overlap, max_tokens // 2))
    chunks: list[Chunk] = []
    current: list[_Piece] = []
    used = 0
    fresh = 0  # tokens in ``current`` that are not overlap from the previous chunk

    def flush() -> list[_Piece]:
        nonlocal used, fresh
        chunks.append(_chunk(current, unit))
        tail: list[_Piece] = []
        kept = 0
        for piece in reversed(current):
            if kept + piece.tokens > overlap:
                break
            tail.insert(0, piece)
            kept += piece.tokens
        used, fresh = kept, 0
        return tail

    for block in blocks(lines, kind):
        for piece in _pieces(block, count, max_tokens, kind):
            new_page = unit == "page" and bool(current) and piece.first != current[-1].last
            section_break = (piece.starts_section or new_page) and fresh >= max_tokens // 4
            if fresh and (used + piece.tokens > max_tokens or section_break):
                current = flush()
            while current and used + piece.tokens > max_tokens:  # the overlap must make room
                used -= current.pop(0).tokens
            current.append(piece)
            used += piece.tokens
            fresh += piece.tokens
    if fresh:
        chunks.append(_chunk(current, unit))
    return chunks


def _joiner(piece: _Piece) -> str:
    return " " if piece.joined else "\n\n" if piece.new_block else "\n"


def _chunk(pieces: list[_Piece], unit: str) -> Chunk:
    text = pieces[0].text + "".join(_joiner(p) + p.text for p in pieces[1:])
    return Chunk(text, pieces[0].first, pieces[-1].last, unit)
