"""Resource accounting for the in_memory backend: work waits until its resources are free, then runs on a pool
thread. A task blocked in get/wait hands its resources back while it waits (as Ray releases a blocked task's
CPU), so nested work cannot deadlock the pool."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

Signature = tuple[tuple[str, float], ...]


class Ledger:
    """Free resources, and FIFO queues of work waiting for them (one queue per distinct request)."""

    def __init__(self, totals: Mapping[str, float], max_threads: int = 4096) -> None:
        self.totals = dict(totals)
        self._free = dict(totals)
        self._queues: dict[Signature, deque[Callable[[], Any]]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="fray-in-memory")
        self._closed = False

    def _fits(self, request: Signature) -> bool:
        free = self._free
        return all(free.get(key, 0.0) >= qty for key, qty in request)

    def _take(self, request: Signature) -> None:
        for key, qty in request:
            self._free[key] = self._free.get(key, 0.0) - qty

    def submit(self, request: Signature, run: Callable[[], Any]) -> None:
        """Run `run` on a pool thread once `request` fits; it must call release(request) when done."""
        with self._lock:
            if self._closed:
                raise RuntimeError("in_memory context is shut down")
            queue = self._queues.get(request)
            if not queue and self._fits(request):
                self._take(request)
                start = True
            else:
                self._queues.setdefault(request, deque()).append(run)
                start = False
        if start:
            self._pool.submit(run)

    def release(self, request: Signature) -> None:
        with self._lock:
            for key, qty in request:
                self._free[key] = self._free.get(key, 0.0) + qty
            ready = self._drain()
        for run in ready:
            self._pool.submit(run)

    def reacquire(self, request: Signature) -> None:
        """Take resources back after a blocking get, even past the total for a moment (no waiting, as in Ray)."""
        with self._lock:
            self._take(request)

    def _drain(self) -> list[Callable[[], Any]]:
        ready = []
        for request, queue in self._queues.items():
            while queue and self._fits(request):
                self._take(request)
                ready.append(queue.popleft())
        return ready

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queues.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def signature(resources: Mapping[str, float]) -> Signature:
    return tuple(sorted(resources.items()))
