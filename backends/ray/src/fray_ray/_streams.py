"""Streaming results on Ray: a generator task or actor method runs as a Ray generator task
(`num_returns="streaming"`); its `ray.ObjectRefGenerator` is read through `RayStreamSource`, which hands out fray
ObjectRefs over the items' Ray refs.

Items are packed in the worker like any task result (`_remote.stream_items`), so their get decodes them like a
normal result. An exception in the generator is Ray's next stream item (a RayTaskError, translated by get into
the original exception type), then the stream ends. Closing the stream (or dropping it) cancels the generator
task: Ray stops a generator task, and also an actor's generator method, at its next yield. Dropping Ray's
ObjectRefGenerator alone does NOT stop the producer (measured: a dropped endless generator kept running), so close
always cancels a producer that has not finished (through the context's CancelTracker: never a finished one,
and only once the task's Ray ref arguments are ready, see fray_ray._cancel).
"""

from __future__ import annotations

import threading
from typing import Any

from fray.backend import ObjectRef
from fray.errors import GetTimeoutError
from fray_ray._cancel import CancelTracker

__all__ = ["RayStreamSource"]

_BACKEND = "ray"


class RayStreamSource:
    """fray.runtime.streams.StreamSource over a ray.ObjectRefGenerator.

    `next_ref` may block in Ray (serialized by a lock: Ray's generator is not thread-safe); `close` never takes
    that lock to cancel, so a consumer blocked in next_ref on another thread is released by it (its pending
    item then resolves to TaskCancelledError)."""

    __slots__ = ("__weakref__", "_cancels", "_closed", "_deps", "_generator", "_lock")

    def __init__(self, generator: Any, deps: list[Any], cancels: CancelTracker) -> None:
        self._generator: Any = generator
        self._deps = deps  # Ray refs among the task's arguments that may not be ready yet
        self._cancels = cancels  # the context's
        self._lock = threading.Lock()
        self._closed = False

    def next_ref(self, timeout: float | None) -> ObjectRef | None:
        with self._lock:
            generator = self._generator
            if generator is None:
                return None
            try:
                ref = generator._next_sync(timeout_s=None if timeout is None else max(0.0, timeout))
            except StopIteration:
                self._generator = None  # Ray frees the stream's bookkeeping
                self._deps = []
                return None
            finally:
                if self._closed:  # closed while we waited: drop Ray's generator here
                    self._generator = None
                    self._deps = []
            if ref.is_nil():
                raise GetTimeoutError(f"no next item of the stream within {timeout} s")
            return ObjectRef(ref, _BACKEND)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        generator = self._generator
        if generator is not None:
            self._cancels.cancel_stream(generator, self._deps)
        if self._lock.acquire(blocking=False):  # else next_ref drops it when it returns
            try:
                self._generator = None
                self._deps = []
            finally:
                self._lock.release()
