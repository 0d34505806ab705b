"""What the driver reads from every live worker process of its context: their transfer counts (summed by
`ctx.transfer_stats()`) and their new events (`ctx.events()`, fray.telemetry.events). One call per process, all sent
before any is awaited; a process that does not answer in time is left out (and logged), never waited for longer."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from fray.backend import PathStats, ProcessEvents, merge
from fray_monarch.core import runtime
from fray_monarch.driver.processes import ProcessPool

__all__ = ["EventPuller", "TransferTally"]

READ_TIMEOUT = 30.0
PUSHED_CAPACITY = 10_000  # batches pushed and not read yet (each up to a process's ring)


class TransferTally:
    """The worker processes' transfer counts, which only grow: each live process's as read now, and what was last
    read from each process that is gone since (one killed by `ctx.kill` is read just before; one that crashed
    keeps its last reading), so that `ctx.transfer_stats()` never forgets what a stopped process moved."""

    def __init__(self, pool: ProcessPool) -> None:
        self.pool = pool
        self._lock = threading.Lock()
        self._last: dict[str, dict[str, PathStats]] = {}  # process key -> its counts as last read
        self._gone: dict[str, PathStats] = {}  # the last readings of processes no longer live, summed

    def read(self) -> list[dict[str, PathStats]]:
        live = self.pool.live()
        futures = [(p.key, p.worker.transfer_stats.call_one()) for p in live]
        fresh: dict[str, dict[str, PathStats]] = {}
        for key, fut in futures:
            try:
                fresh[key] = fut.get(timeout=READ_TIMEOUT)
            except Exception:
                runtime.log.debug("fray: transfer stats of a worker not read", exc_info=True)
        alive = {p.key for p in self.pool.live()}
        with self._lock:
            self._last.update(fresh)
            for key in [k for k in self._last if k not in alive]:
                self._gone = merge(self._gone, self._last.pop(key))
            return [self._gone, *self._last.values()]


class EventPuller:
    """The workers' events, each delivered once: pushed by a worker with its reports (at most every
    PUSH_INTERVAL while it has new ones, so a process that crashes loses at most that much) and pulled from each
    live process when the driver reads them (what an actor's process recorded since its last push)."""

    def __init__(self, pool: ProcessPool, capacity: int = PUSHED_CAPACITY) -> None:
        self.pool = pool
        self.pushed: deque[Any] = deque(maxlen=capacity)  # batches as they came, until the driver reads them

    def deliver(self, data: Any) -> None:
        """A batch a worker pushed: kept as it came (read, and checked, only when the driver asks: the
        coordinator's thread shares the driver's GIL)."""
        self.pushed.append(data)

    def pull(self) -> list[ProcessEvents]:
        futures = [p.worker.events.call_one() for p in self.pool.live()]
        batches = []
        while self.pushed:
            try:
                batches.append(ProcessEvents.from_json(self.pushed.popleft()))
            except ValueError:
                runtime.log.warning("fray: a worker's events were not a batch of events", exc_info=True)
        for fut in futures:
            try:
                batches.append(ProcessEvents.from_json(fut.get(timeout=READ_TIMEOUT)))
            except Exception:
                runtime.log.debug("fray: events of a worker not read", exc_info=True)
        return batches
