"""The threads of one kit actor: up to max_concurrency daemon threads running its calls in the order sent.

Not a concurrent.futures.ThreadPoolExecutor: Python joins every executor thread at exit (an atexit hook), so a
script that ends, or is interrupted with Ctrl-C, while an actor method runs would wait for that method to return
(for as long as the call takes, also after fray.shutdown()). An actor's threads are daemons, as in_memory's task workers
are: when the program ends, a call still running is abandoned with the process, as Ray's driver exit ends its
workers mid-call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ActorThreads"]

_STOP: Any = object()


class ActorThreads:
    """submit(fn, *args) runs fn(*args) on one of up to `size` threads, in the order submitted; shutdown()
    drops what has not started and lets each thread end after its current call."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """RuntimeError once shut down (as an executor's submit)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the actor's threads are shut down")
            start = self._idle <= 0 and self._threads < self._size
            if start:
                self._threads += 1
            else:
                self._idle -= 1  # claimed by this call
        self._calls.put((fn, args))
        if start:
            threading.Thread(target=self._loop, name=self._name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            call = self._calls.get()
            if call is _STOP:
                return
            fn, args = call
            try:
                fn(*args)
            except BaseException:  # (its caller settles the call's own outcome; nothing may end this thread)
                pass
            # Not kept while waiting for the next call: a call's arguments hold its refs, and with them the values
            # lent to an SPMD member's process (a ThreadPoolExecutor's worker drops its work item the same way).
            del call, fn, args
            with self._lock:
                if self._closed:
                    return
                self._idle += 1

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            threads = self._threads
        while True:  # calls not started are dropped (their callers were told the actor died)
            try:
                self._calls.get_nowait()
            except queue.Empty:
                break
        for _ in range(threads):
            self._calls.put(_STOP)
