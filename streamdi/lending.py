"""Objects that are costly to open, lent to one thread at a time and kept for the next borrower.

`streamdi.lake.Lake` lends its open Delta tables this way. A kept delta-rs table handle is brought up to date with
the commits made since it was last used (a `stat` when there are none), where opening one replays the log (6-17 ms
on this 2-core machine). A handle must not be shared by threads at the same moment (one thread's catch-up would
move another's snapshot in the middle of a read), so it is lent: a thread borrows it for one read or one commit and
gives it back. A process then opens a table about as many times as threads use it at the same moment, not once per
thread that ever uses it: an SF 3 incremental `streamdi load` opened its tables 209 times on 15 threads when each
thread kept its own.

A borrower that fails gives nothing back (a handle in an unknown state is let go), and a handle kept under another
`stamp` than the one asked for (a table removed and created again under the same path) is let go too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

H = TypeVar("H")


class Lender(Generic[H]):
    """Handles per key, each lent to one borrower at a time: `opener(key)` makes one when none is free,
    `catch_up(key, handle)` brings a kept one up to date before it is lent again (if it raises, a new one is
    opened)."""

    def __init__(self, opener: Callable[[Hashable], H], catch_up: Callable[[Hashable, H], None]) -> None:
        self._open = opener
        self._catch_up = catch_up
        self._free: dict[Hashable, list[tuple[Hashable, H]]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def lend(self, key: Hashable, stamp: Hashable | None) -> Iterator[H]:
        """A handle for `key`, valid for `stamp`, for the block's duration. With `stamp` None the handle is opened
        for this borrower only and not kept."""
        handle = self._kept(key, stamp) if stamp is not None else None
        if handle is None:
            handle = self._open(key)
        yield handle  # a borrower that raises does not come back here: the handle is let go
        if stamp is not None:
            with self._lock:
                self._free.setdefault(key, []).append((stamp, handle))

    def _kept(self, key: Hashable, stamp: Hashable) -> H | None:
        with self._lock:
            free = self._free.get(key, [])
            while free:
                kept_stamp, handle = free.pop()
                if kept_stamp == stamp:
                    break
            else:
                return None
        try:
            self._catch_up(key, handle)
        except Exception:  # noqa: BLE001 - a handle that cannot catch up is replaced by a new one
            return None
        return handle

    def held(self) -> int:
        """Handles kept and free now (for tests and diagnostics)."""
        with self._lock:
            return sum(len(free) for free in self._free.values())
