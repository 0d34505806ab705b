"""Object ids, the ref payload, and per-process reference counting.

Every value (task result, actor call result, put) lives in the controller's object table until nothing refers
to it. A process counts the live `RefPayload`s of each id it holds; the controller frees an entry when its own
count, the holds of worker processes, and the blobs that contain it are all gone (after a short grace period).
Worker processes report holds (an id arrived) and releases (its last payload died) to the controller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fray.backend import note_contained

__all__ = ["DepMarker", "RefPayload", "Tracker", "set_tracker"]


class Tracker:
    """Counts live payloads per id in this process; calls on_first(id, arrived) (unless None) and on_zero(id)."""

    def __init__(self, on_first: Callable[[str, bool], None] | None, on_zero: Callable[[str], None]) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.RLock()  # (reentrant: a finalizer run by the GC may release a payload while held)
        self.on_first = on_first
        self.on_zero = on_zero

    def acquire(self, oid: str, arrived: bool) -> None:
        with self.lock:
            n = self.counts.get(oid, 0)
            self.counts[oid] = n + 1
        if n == 0 and self.on_first is not None:
            self.on_first(oid, arrived)

    def release(self, oid: str) -> None:
        with self.lock:
            n = self.counts.get(oid, 0) - 1
            if n > 0:
                self.counts[oid] = n
                return
            self.counts.pop(oid, None)
        self.on_zero(oid)


_tracker: Tracker | None = None


def set_tracker(tracker: Tracker | None) -> None:
    global _tracker
    _tracker = tracker


class RefPayload:
    """The backend payload inside a fray ObjectRef: the object's id, counted while alive."""

    __slots__ = ("__weakref__", "counted", "id")

    def __init__(self, oid: str, arrived: bool = False) -> None:
        self.id = oid
        tracker = _tracker
        self.counted = tracker is not None
        if tracker is not None:
            tracker.acquire(oid, arrived)

    def __del__(self) -> None:
        tracker = _tracker
        if self.counted and tracker is not None:
            try:
                tracker.release(self.id)
            except Exception:
                pass

    def __reduce__(self) -> tuple[Any, ...]:
        note_contained(self)
        return (_arrive, (self.id,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefPayload) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return self.id


def _arrive(oid: str) -> RefPayload:
    return RefPayload(oid, arrived=True)


class DepMarker:
    """Stands in for a top-level ObjectRef argument; the worker puts the value there before the call."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (DepMarker, (self.index,))


def owner_key(oid: str) -> str:
    return oid.split("-", 1)[0]
