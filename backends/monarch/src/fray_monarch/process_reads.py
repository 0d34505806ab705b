"""What the driver reads from every live worker process of its context: their transfer counts (summed by
`ctx.transfer_stats()`) and their new events (`ctx.events()`, fray.events). One call per process, all sent before
any is awaited; a process that does not answer in time is left out (and logged), never waited for longer."""

from __future__ import annotations

from fray.events import ProcessEvents
from fray.transfers import PathStats
from fray_monarch import _runtime
from fray_monarch.processes import ProcessPool

__all__ = ["EventPuller", "transfer_stats"]

READ_TIMEOUT = 30.0


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
    """Each live process's events since the last pull: it remembers, per process, the last event it read."""

    def __init__(self, pool: ProcessPool) -> None:
        self.pool = pool
        self.cursors: dict[str, int] = {}  # process key -> the seq of its last event pulled

    def pull(self) -> list[ProcessEvents]:
        procs = self.pool.live()
        futures = [(p, p.worker.events.call_one(self.cursors.get(p.key, 0))) for p in procs]
        batches = []
        for proc, fut in futures:
            try:
                batch = ProcessEvents.from_json(fut.get(timeout=READ_TIMEOUT))
            except Exception:
                _runtime.log.debug("fray: events of a worker not read", exc_info=True)
                continue
            if batch.events:
                self.cursors[proc.key] = batch.events[-1].seq
            batches.append(batch)
        return batches
