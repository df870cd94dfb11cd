"""Things made on first use, by name, once: loaded models in the engine's table and the server's.

The table's lock is held only to look up and to record, never through the making: one making per name at a
time (other callers for that name wait for it, not for the table), other names are made meanwhile, and
every reader of the table goes on."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class MadeOnce(Generic[T]):
    """The makings of one table, guarded by ``lock`` (the table's own)."""

    def __init__(self, table: dict[str, T], lock: threading.Lock) -> None:
        self._table = table
        self._lock = lock
        self._making: dict[str, threading.Lock] = {}  # a lock per name being made

    def get(
        self,
        name: str,
        make: Callable[[], T],
        *,
        check: Callable[[], None] = lambda: None,
        aliases: Callable[[T], Iterable[str]] = lambda made: (),
    ) -> T:
        """The table's entry for ``name``, made now unless it is there; ``check`` runs (under the table's
        lock) before a making, ``aliases`` are more names the made entry is recorded under."""
        with self._lock:
            found = self._table.get(name)
            if found is not None:
                return found
            check()
            making = self._making.setdefault(name, threading.Lock())
        try:
            with making:
                with self._lock:
                    found = self._table.get(name)
                if found is not None:  # made by the caller this one waited for
                    return found
                made = make()
                with self._lock:
                    self._table[name] = made
                    for other in aliases(made):
                        self._table[other] = made
                return made
        finally:
            with self._lock:
                if self._making.get(name) is making:
                    del self._making[name]
