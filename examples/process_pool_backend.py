"""A fray backend on Python's own `concurrent.futures.ProcessPoolExecutor`, written against `fray.kit`.

Tasks run in the pool's worker processes; actors live on threads of the driver (the kit's default: a pool has no
way to pin an instance to one of its processes). Everything else is the kit's: the object table, resources and
lending, retries, names, call queues, events, transfer stats. What this file adds is "start this call there".

    from fray import register_backend
    from process_pool_backend import ProcessPoolBackend
    register_backend("process_pool", ProcessPoolBackend)
    if __name__ == "__main__":  # (as with any ProcessPoolExecutor: its processes import the main module)
        ctx = fray.init("process_pool?cpus=4")

Nested work (a task that submits tasks, gets refs, calls actors) reaches the driver through fray.kit.remote: an
authenticated Unix socket in a private directory, whose key only this pool's processes are given.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, ClassVar

from fray.backend import Backend, Capability, host_gpus, host_resources, non_negative
from fray.errors import WorkerCrashedError
from fray.kit import KitJobContext, LocalClusterContext, TaskRun, remote

NAME = "process_pool"
# Processes start on demand, up to this many: a task blocked in get lends its CPUs to the next one (the kit's
# ledger keeps running work within the CPUs), so a chain of nested tasks needs a process per level.
MAX_PROCESSES = 64


class ProcessPoolJobContext(KitJobContext):
    backend = NAME
    capabilities = frozenset({Capability.DETACHED_ACTORS, Capability.ASYNC_ACTORS})

    def __init__(self, resources: dict[str, float], **options: Any) -> None:
        super().__init__(resources, **options)
        self._service = remote.RemoteService(self)
        self._pool_lock = threading.Lock()
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            MAX_PROCESSES,
            mp_context=multiprocessing.get_context("forkserver"),  # (forking a threaded driver is unsafe)
            initializer=remote.start_worker,
            initargs=(self._service.setup,),
        )

    def _run_task(self, run: TaskRun, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        pool = self._pool
        try:
            reply = pool.submit(remote.run_call, *self._service.request(run, args, kwargs)).result()
        except BrokenProcessPool:  # a worker died: the pool is unusable, and every call it ran failed with it
            with self._pool_lock:
                if self._pool is pool:
                    self._pool = self._new_pool()
            pool.shutdown(wait=False, cancel_futures=True)
            raise WorkerCrashedError(f"the process running task {run.name} died") from None
        return self._service.result(reply)

    def _shutdown(self) -> None:
        super()._shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._service.close()


class ProcessPoolClusterContext(LocalClusterContext):
    backend = NAME


class ProcessPoolBackend(Backend):
    name = NAME
    test_spec = f"{NAME}?cpus=4"
    options: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"cpus": non_negative, "gpus": non_negative}

    @property
    def capabilities(self) -> frozenset[Capability]:
        return ProcessPoolJobContext.capabilities | ProcessPoolClusterContext.capabilities

    def job_context(self, **opts: Any) -> ProcessPoolJobContext:
        gpus = host_gpus(opts.get("gpus"))
        host = host_resources()
        totals = {"CPU": opts.get("cpus", host["CPU"]), "GPU": float(len(gpus)), "memory": host["memory"]}
        return ProcessPoolJobContext(totals, gpus=gpus)

    def cluster_context(self, **opts: Any) -> ProcessPoolClusterContext:
        return ProcessPoolClusterContext(gpus=host_gpus(opts.get("gpus")))
