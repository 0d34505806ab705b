"""Streaming results: a generator task or actor method yields items; the caller gets one ObjectRef per item, in
order, as the items are produced.

`ObjectRefStream` is the one type every backend returns; a backend supplies a `StreamSource` (how to learn of the
next item, how to stop the producer). An exception in the generator arrives as the next item (its get raises
it); the stream then ends.
"""

from __future__ import annotations

import threading
from collections import deque

from fray.errors import GetTimeoutError
from fray.runtime.refs import ObjectRef, ObjectRefStream, StreamSource

__all__ = [
    "ItemQueue",
    "ObjectRefStream",
    "StreamSource",
]  # the last two are fray.runtime.refs' (an ActorMethod streams)


class ItemQueue:
    """A thread-safe queue of item refs ending with None: what a backend's producer side appends to and its
    StreamSource reads from. `stopped` tells the producer the consumer has gone."""

    def __init__(self) -> None:
        self._items: deque[ObjectRef | None] = deque()
        self._cond = threading.Condition()
        self.stopped = threading.Event()

    def append(self, ref: ObjectRef | None) -> None:
        with self._cond:
            self._items.append(ref)
            self._cond.notify_all()

    def end(self) -> None:
        self.append(None)

    def next_ref(self, timeout: float | None) -> ObjectRef | None:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._items), None if timeout is None else max(0.0, timeout)):
                raise GetTimeoutError(f"no next item of the stream within {timeout} s")
            ref = self._items.popleft()
            if ref is None:
                self._items.appendleft(None)  # stays ended
            return ref

    def close(self) -> None:
        self.stopped.set()
