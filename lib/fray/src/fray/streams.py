"""Streaming results: a generator task or actor method yields items; the caller gets one ObjectRef per item, in
order, as the items are produced.

`ObjectRefStream` is the one type every backend returns; a backend supplies a `StreamSource` (how to learn of the
next item, how to stop the producer). An exception in the generator arrives as the next item (its get raises
it); the stream then ends.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Protocol

from fray.errors import GetTimeoutError
from fray.refs import ObjectRef

__all__ = ["ItemQueue", "ObjectRefStream", "StreamSource"]


class StreamSource(Protocol):
    def next_ref(self, timeout: float | None) -> ObjectRef | None:
        """The next item's ref (None at the end of the stream); GetTimeoutError after timeout."""

    def close(self) -> None:
        """The consumer stops reading: stop the producer (or let it drain) and free what it holds."""


class ObjectRefStream:
    """An iterator of ObjectRefs, one per item a generator yields, in order, as they are produced.

    `for ref in stream: ctx.get(ref)`; `stream.next_ref(timeout=...)` for a bounded wait; breaking out early and
    dropping the stream (or `stream.close()`, or `with stream:`) stops the producer.
    """

    __slots__ = ("__weakref__", "_closed", "_done", "_source", "backend")

    def __init__(self, source: StreamSource, backend: str) -> None:
        self._source = source
        self.backend = backend
        self._done = False
        self._closed = False

    def __iter__(self) -> ObjectRefStream:
        return self

    def __next__(self) -> ObjectRef:
        ref = self.next_ref()
        if ref is None:
            raise StopIteration
        return ref

    def next_ref(self, timeout: float | None = None) -> ObjectRef | None:
        """The next item's ref, waiting up to `timeout` seconds for the producer; None once the stream ended."""
        if self._done:
            return None
        ref = self._source.next_ref(timeout)
        if ref is None:
            self._done = True
        return ref

    def close(self) -> None:
        """Stop the producer if it still runs. Idempotent; refs already handed out stay readable."""
        if not self._closed:
            self._closed = True
            self._done = True
            self._source.close()

    def __enter__(self) -> ObjectRefStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown, a backend already gone: nothing to stop then
            pass

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("an ObjectRefStream cannot be passed to a task or actor; pass the refs it yields instead")

    def __repr__(self) -> str:
        state = "ended" if self._done else "open"
        return f"ObjectRefStream({self.backend}, {state})"


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
