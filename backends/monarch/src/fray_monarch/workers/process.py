"""The fray side of one worker process: its runtime (store, reports), its job context (whose calls go to the
driver's coordinator) and its task runner, made once per process by the first Monarch actor spawned there."""

from __future__ import annotations

import threading

from monarch.actor import current_rank

from fray.backend import current as fray_current
from fray_monarch.core.context import MonarchJobContext
from fray_monarch.core.protocol import WorkerSetup
from fray_monarch.workers.client import WorkerClient
from fray_monarch.workers.runtime import WorkerRuntime
from fray_monarch.workers.tasks import TaskRunner

__all__ = ["Worker", "ensure_worker", "mesh_index"]


class Worker:
    """The fray side of one worker process: its runtime (store, reports), its job context (whose calls go to the
    driver's coordinator; shutting it down from inside is a no-op) and its task runner."""

    def __init__(self, setup: WorkerSetup) -> None:
        self.rt = WorkerRuntime(setup)
        self.ctx = MonarchJobContext(WorkerClient(self.rt, setup.nodes), owns_resources=False)
        self.tasks = TaskRunner(self.rt, self.ctx, setup.capacity)
        fray_current.set_default(self.ctx)


_worker_lock = threading.Lock()
_worker: Worker | None = None


def mesh_index() -> int:
    """The flat rank of the actor being made here in the mesh it was spawned on (0 on a mesh of one process)."""
    try:
        return int(current_rank().rank)
    except Exception:
        return 0


def ensure_worker(setup: WorkerSetup | list[WorkerSetup], index: int) -> Worker:
    """This process's Worker, made by the first actor spawned here. `setup`: one for the whole mesh, or a list with
    one per process (by flat rank: `index`)."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = Worker(setup[index] if isinstance(setup, list) else setup)
        return _worker
