"""One item of an executor's `map` (fray.executor): queued like a submit's work, but with no Future of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FuturesTimeoutError
from typing import Any

from fray.refs import ObjectRef

__all__ = ["MapItem", "MapRun"]


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
