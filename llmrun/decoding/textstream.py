"""Turning a stream of token bytes into text that is safe to print as it comes.

Two small pure pieces used by every backend:

* :class:`Utf8Stream` holds back the bytes of a multi-byte character that a
  token split, so a half character is never printed as U+FFFD.
* :class:`StopMatcher` holds back text that could still become a stop string,
  and cuts the output at the first stop string found.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class Utf8Stream:
    """Incremental UTF-8 decoding of token pieces."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        """Text completed by ``piece``; incomplete trailing bytes wait for the next one."""
        return self._decoder.decode(piece)

    @property
    def pending(self) -> bytes:
        """Bytes of a character not yet complete."""
        buffered: bytes = self._decoder.getstate()[0]
        return buffered

    def finish(self) -> str:
        """End of stream: an unfinished character is dropped, never printed as U+FFFD."""
        self._decoder.reset()
        return ""


class StopMatcher:
    """Finds stop strings in streamed text without printing past them."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped_by: str | None = None

    def feed(self, text: str) -> str:
        """Text that is safe to emit now; after a stop string is found, always ``""``."""
        if self.stopped_by is not None:
            return ""
        if not self._stops:
            return text
        buffer = self._held + text
        first: tuple[int, str] | None = None
        for stop in self._stops:
            index = buffer.find(stop)
            if index != -1 and (first is None or index < first[0]):
                first = (index, stop)
        if first is not None:
            self.stopped_by = first[1]
            self._held = ""
            return buffer[: first[0]]
        hold = self._longest_partial(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold]

    def flush(self) -> str:
        """End of stream without a stop: release the held text."""
        held, self._held = self._held, ""
        return "" if self.stopped_by is not None else held

    def _longest_partial(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop."""
        best = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:length]):
                    best = length
                    break
        return best
