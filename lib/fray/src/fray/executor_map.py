"""An executor's `map` (fray.executor): its items, queued like a submit's work but with no Future of their own
(on an executor made without max_workers, sent to the backend without a slot each: MapsInFlight), and the
reading of their values in order (read_map)."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FuturesTimeoutError
from dataclasses import dataclass
from typing import Any

from fray.runtime.refs import ObjectRef
from fray.runtime.remote_errors import RemoteError, capture_exception, rebuild

__all__ = ["MAP_BATCH", "ChunkResult", "MapItem", "MapRun", "MapsInFlight", "read_map", "run_chunk"]

# A map's values are read with one `get` for as many items as are on the backend when the next is reached, up
# to this many (a get per item cost more than the items' tasks did).
MAP_BATCH = 64


class MapRun:
    """What the items of one `map` share: the consumer waits here for the item it reached to leave the queue."""

    __slots__ = ("changed", "waiting")

    def __init__(self) -> None:
        self.changed = threading.Condition(threading.Lock())
        self.waiting = False

    def wake(self) -> None:
        # An item's state is set before `waiting` is read, and `waiting` before the consumer reads the state, so
        # either the consumer sees the new state or this sees it waiting (and then waits for it to be in wait()).
        if self.waiting:
            with self.changed:
                self.changed.notify_all()


class MapItem:
    """One task of a `map`: queued in the executor like a submit's work, but with no Future: its consumer reads
    the value with the context's `get` (a Future per item was most of what map cost over create_task + get)."""

    __slots__ = ("args", "cancelled", "error", "fn", "ref", "run")

    def __init__(self, run: MapRun, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.run, self.fn, self.args = run, fn, args
        self.ref: ObjectRef | None = None
        self.error: BaseException | None = None
        self.cancelled = False

    def started(self, end: float | None) -> ObjectRef:
        """The item's ref once it is on the backend; its refusal, CancelledError, or TimeoutError at `end`."""
        if self.ref is None and self.error is None and not self.cancelled:
            run = self.run
            with run.changed:
                run.waiting = True
                try:
                    while self.ref is None and self.error is None and not self.cancelled:
                        left = None if end is None else end - time.monotonic()
                        if left is not None and left <= 0:
                            raise FuturesTimeoutError()
                        run.changed.wait(left)
                finally:
                    run.waiting = False
        if self.error is not None:
            raise self.error
        if self.ref is None:
            raise CancelledError()
        ref, self.ref, self.args = self.ref, None, ()
        return ref


class MapsInFlight:
    """The maps whose items went to the backend without a slot each (an executor made without max_workers: a
    settle callback per item cost more than the item's own task). Each map's items not yet read by its consumer
    are listed here; what a map leaves unread when it ends (a break, an error, a dropped iterator) is handed back
    (`left`), for the executor to follow until it settles, so that shutdown(wait=True) still waits for it.

    No lock: `close` runs where the map's generator is closed, which can be inside a garbage collection on any
    thread, even one holding the executor's lock; dict operations and SimpleQueue.put are atomic."""

    def __init__(self) -> None:
        self._live: dict[int, tuple[deque[MapItem], list[ObjectRef]]] = {}
        self._ended: queue.SimpleQueue[tuple[deque[MapItem], list[ObjectRef]]] = queue.SimpleQueue()
        self._keys = itertools.count()

    def open(self, items: deque[MapItem], reading: list[ObjectRef]) -> int:
        """A map starts: `items` are those not yet taken by its consumer, `reading` the refs it took and has not
        given out yet. Returns the key to close it with."""
        key = next(self._keys)
        self._live[key] = (items, reading)
        return key

    def close(self, key: int) -> None:
        """The map ended (idempotent)."""
        ended = self._live.pop(key, None)
        if ended is not None and (ended[0] or ended[1]):
            self._ended.put(ended)

    def left(self) -> list[ObjectRef]:
        """The refs that the maps closed since the last call left unread (each ref once)."""
        refs: list[ObjectRef] = []
        while True:
            try:
                items, reading = self._ended.get_nowait()
            except queue.Empty:
                return refs
            refs.extend(_refs_of(items, reading))

    def unread(self) -> list[ObjectRef]:
        """The refs of the items that the live maps' consumers have not read yet."""
        while True:
            try:
                live = list(self._live.values())
                break
            except RuntimeError:  # (a map closed by another thread meanwhile)
                continue
        return [ref for items, reading in live for ref in _refs_of(items, reading)]


def _refs_of(items: deque[MapItem], reading: list[ObjectRef]) -> list[ObjectRef]:
    return [*reading, *(ref for work in list(items) if (ref := work.ref) is not None)]


@dataclass
class ChunkResult:
    """What a task running a chunk of `map` items returns: the values up to the first failure, and that failure."""

    values: list[Any]
    error: RemoteError | None


def run_chunk(fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> ChunkResult:
    values = []
    for args in chunk:
        try:
            values.append(fn(*args))
        except Exception as exc:  # the items before it are still yielded, then this is raised (as map does)
            return ChunkResult(values, capture_exception(exc))
    return ChunkResult(values, None)


Getter = Callable[[Any, "float | None"], Any]  # get(ref or refs, end): the values, or TimeoutError at `end`


def read_map(
    get: Getter,
    queued: deque[MapItem],
    refs: list[ObjectRef],
    more: Iterator[MapItem] | None,
    end: float | None,
    chunked: bool,
    closed: Callable[[], None] | None,
) -> Iterator[Any]:
    """Each item's value in order, read with `get` (`refs`: those taken from `queued` and not given out yet); at
    an error, a timeout or a close, the items still queued here are cancelled (as map's futures are), and
    `closed` is called (where the executor follows what a map leaves unread: MapsInFlight)."""
    try:
        while queued:
            if more is not None:
                queued.extend(itertools.islice(more, 1))
            refs.append(queued[0].started(end))
            queued.popleft()
            if not chunked:  # with the items after it already on the backend: one get for them all
                while more is None and queued and len(refs) < MAP_BATCH and queued[0].ref is not None:
                    refs.append(queued.popleft().started(end))  # (with a buffersize: one by one)
                yield from _values(get, refs, end)
                continue
            chunk: ChunkResult = get(refs[0], end)
            refs.clear()
            yield from chunk.values
            if chunk.error is not None:
                raise rebuild(chunk.error)
    finally:
        for work in queued:
            work.cancelled = True
        if closed is not None:
            closed()


def _values(get: Getter, refs: list[ObjectRef], end: float | None) -> Iterator[Any]:
    """The values of refs in order. Where one of them failed (or the time ran out), they are read one by one,
    so that the values before it are given and its error is raised when it is reached."""
    if len(refs) > 1:
        try:
            values = deque(get(refs, end))
        except Exception:
            values = None
        if values is not None:
            refs.clear()
            while values:  # (each value leaves the batch as it is given: the caller may drop it)
                yield values.popleft()
            return
    while refs:
        value = get(refs[0], end)  # (a ref whose get raised stays listed: it may still be running)
        del refs[0]
        yield value
