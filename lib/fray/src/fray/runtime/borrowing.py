"""Device values borrowed, not copied, while `get(out=...)` loads a value on this thread.

A plain get gives the caller a copy of its own of every device value (fray.runtime.cuda_values). A get into the
caller's own tensors (fray.runtime.receive) has no use for that copy: it would be a temporary, copied once more into
`out` and freed. So while such a get loads its value, the readers of device values hand out what they read
from instead, read-only: the opened share of the producer's snapshot (fray.runtime.device_shares), the staged bytes
in host memory, the kept copy of this process. The one copy is get's, into `out`; what each borrow holds (a share's
lease on the producer's snapshot) is let go once that copy is done.

A value loaded on another thread (a backend's own) is not borrowed: it is copied as for a plain get, and the get
into `out` is then as correct, only one copy slower. Work that a get runs on its own thread (a task not started
yet, run there) loads its arguments in `not_borrowing()`: they are its own copies, as everywhere.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["Borrows", "borrowing", "current_borrows", "not_borrowing"]

log = logging.getLogger("fray")

_local = threading.local()


class Borrows:
    """What the values loaded in one `borrowing()` scope hold: each is let go (last borrowed first) when it ends."""

    def __init__(self) -> None:
        self._releases: list[Callable[[], None]] = []

    def hold(self, release: Callable[[], None]) -> None:
        """`release` runs once the borrowed value has been read (the scope's end)."""
        self._releases.append(release)

    def release_all(self) -> None:
        while self._releases:
            release = self._releases.pop()
            try:
                release()
            except Exception:  # one borrow's failure never keeps the others held
                log.exception("fray: letting go of a borrowed device value failed")


def current_borrows() -> Borrows | None:
    """The borrows of the `borrowing()` scope this thread is in, if any: a reader of device values borrows then."""
    found: Borrows | None = getattr(_local, "borrows", None)
    return found


@contextmanager
def borrowing() -> Iterator[Borrows]:
    """A scope in which this thread's loads borrow device values (see the module doc); at its end, every borrow is
    let go. The caller copies what it needs out of the loaded value before the scope ends."""
    outer = current_borrows()
    borrows = Borrows()
    _local.borrows = borrows
    try:
        yield borrows
    finally:
        _local.borrows = outer
        borrows.release_all()


@contextmanager
def not_borrowing() -> Iterator[None]:
    """A scope in which this thread's loads copy as a plain get's do, inside a `borrowing()` one: for work run on
    the waiting thread (a task its get runs there), whose values are its own."""
    outer = current_borrows()
    _local.borrows = None
    try:
        yield
    finally:
        _local.borrows = outer
