"""What the driver reads from every live worker process of its context: their transfer counts (summed by
`ctx.transfer_stats()`) and their new events (`ctx.events()`, fray.events). One call per process, all sent before
any is awaited; a process that does not answer in time is left out (and logged), never waited for longer."""

from __future__ import annotations

from collections import deque
from typing import Any

from fray.events import ProcessEvents
from fray.transfers import PathStats
from fray_monarch import _runtime
from fray_monarch.processes import ProcessPool

__all__ = ["EventPuller", "transfer_stats"]

READ_TIMEOUT = 30.0
PUSHED_CAPACITY = 10_000  # batches pushed and not read yet (each up to a process's ring)


def transfer_stats(pool: ProcessPool) -> list[dict[str, PathStats]]:
    """Each live process's own transfers."""
    futures = [p.worker.transfer_stats.call_one() for p in pool.live()]
    parts = []
    for fut in futures:
        try:
            parts.append(fut.get(timeout=READ_TIMEOUT))
        except Exception:
            _runtime.log.debug("fray: transfer stats of a worker not read", exc_info=True)
    return parts


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
                _runtime.log.warning("fray: a worker's events were not a batch of events", exc_info=True)
        for fut in futures:
            try:
                batches.append(ProcessEvents.from_json(fut.get(timeout=READ_TIMEOUT)))
            except Exception:
                _runtime.log.debug("fray: events of a worker not read", exc_info=True)
        return batches
