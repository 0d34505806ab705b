"""Streaming results on Ray: a generator task or actor method runs as a Ray generator task
(`num_returns="streaming"`); its `ray.ObjectRefGenerator` is read through `RayStreamSource`, which hands out fray
ObjectRefs over the items' Ray refs.

Items are packed in the worker like any task result (`_remote.stream_items`), so their get decodes them like a
normal result. An exception in the generator is Ray's next stream item (a RayTaskError, translated by get into
the original exception type), then the stream ends. Closing the stream (or dropping it) cancels the generator
task: Ray stops a generator task, and also an actor's generator method, at its next yield. Dropping Ray's
ObjectRefGenerator alone does NOT stop the producer (measured: a dropped endless generator kept running), so close
always cancels a producer that has not finished.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ray

from fray.errors import GetTimeoutError
from fray.refs import ObjectRef

__all__ = ["RayStreamSource"]

_BACKEND = "ray"


def _finished(generator: Any) -> bool:
    """True once the generator task has ended (its completion object is ready)."""
    try:
        ready, _ = ray.wait([generator.completed()], timeout=0, fetch_local=False)
    except Exception:  # Ray disconnected: nothing left to stop
        return True
    return bool(ready)


def _cancel(generator: Any) -> None:
    # Ray 2.60 can abort the driver when cancel meets a task whose result is there but not yet processed
    # (see RayJobContext._ray_cancel): never cancel a generator task that has ended.
    if _finished(generator):
        return
    try:
        ray.cancel(generator, force=False, recursive=True)
    except Exception:  # finished meanwhile, or Ray is gone
        pass


def _cancel_when_ready(generator: Any, deps: list[Any], closed: Any) -> None:
    """Cancel once the task's Ray ref arguments are ready (Ray 2.60 aborts the driver if a task is cancelled
    while it waits for its arguments and they arrive afterwards; see RayJobContext._cancel)."""
    try:
        while not closed():
            _, pending = ray.wait(deps, num_returns=len(deps), timeout=1.0, fetch_local=False)
            if not pending:
                time.sleep(0.2)  # let Ray's dependency resolver finish with the task first
                _cancel(generator)
                return
    except Exception:  # the connection went away meanwhile
        pass


class RayStreamSource:
    """fray.streams.StreamSource over a ray.ObjectRefGenerator.

    `next_ref` may block in Ray (serialized by a lock: Ray's generator is not thread-safe); `close` never takes
    that lock to cancel, so a consumer blocked in next_ref on another thread is released by it (its pending
    item then resolves to TaskCancelledError)."""

    __slots__ = ("__weakref__", "_closed", "_deps", "_generator", "_is_closed", "_lock")

    def __init__(self, generator: Any, deps: list[Any] | None = None, is_closed: Any = None) -> None:
        self._generator: Any = generator
        self._deps = deps or []  # Ray refs among the task's arguments that may not be ready yet
        self._lock = threading.Lock()
        self._closed = False
        self._is_closed = is_closed or (lambda: False)  # the context's "shut down" flag

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
        if generator is not None and not self._is_closed():
            deps = self._deps
            if deps:
                _, pending = ray.wait(deps, num_returns=len(deps), timeout=0, fetch_local=False)
                if pending:
                    threading.Thread(
                        target=_cancel_when_ready,
                        args=(generator, deps, self._is_closed),
                        name="fray-ray-stream-cancel",
                        daemon=True,
                    ).start()
                    generator = None
            if generator is not None:
                _cancel(generator)
        if self._lock.acquire(blocking=False):  # else next_ref drops it when it returns
            try:
                self._generator = None
                self._deps = []
            finally:
                self._lock.release()
