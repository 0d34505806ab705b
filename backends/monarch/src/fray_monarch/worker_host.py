"""The Monarch actor of each worker process (WorkerHost): it makes the process's runtime, runs its tasks, and
answers the controller's messages about the process (frees, capacity, stream stops, death watches)."""

from __future__ import annotations

import os
import threading
from typing import Any

from monarch.actor import current_rank

from fray_monarch import _runtime
from fray_monarch._monarch import Actor, endpoint
from fray_monarch.protocol import ProcInfo, WorkerSetup
from fray_monarch.worker_runtime import WorkerRuntime

_runtime_lock = threading.Lock()
_worker_runtime: WorkerRuntime | None = None


def mesh_index() -> int:
    """This actor's flat rank in the mesh it was spawned on (0 on a mesh of one process)."""
    try:
        return int(current_rank().rank)
    except Exception:
        return 0


def mine(value: Any, index: int) -> Any:
    """One value for the whole mesh, or a list with one per process (by flat rank)."""
    return value[index] if isinstance(value, list) else value


def ensure_runtime(setup: WorkerSetup) -> WorkerRuntime:
    global _worker_runtime
    with _runtime_lock:
        if _worker_runtime is None:
            _worker_runtime = WorkerRuntime(setup)
        return _worker_runtime


class WorkerHost(Actor):
    """Runs tasks in its process (one per worker process); a never-answered `watch` call reports its death."""

    def __init__(self, setup: WorkerSetup | list[WorkerSetup], env: dict[str, str]) -> None:
        os.environ.update(env)  # a process started for tasks with these env vars (see Controller._env_procs)
        _runtime.start_client_context()  # before anything prints Monarch's banner (see _runtime.BANNER)
        self.rt = ensure_runtime(mine(setup, mesh_index()))
        self.watchers: list[Any] = []

    def __cleanup__(self, exc: Any) -> None:
        self.rt.stop()  # no more reports: this process is being stopped

    @endpoint
    def run(self, batch: list[Any]) -> None:
        self.rt.enqueue(batch)

    @endpoint
    def free(self, allocs: list[int]) -> None:
        self.rt.store.free(allocs)

    @endpoint
    def transfer_stats(self) -> Any:
        return self.rt.transfer_stats()

    @endpoint
    def cancel(self, tid: str) -> str:
        return self.rt.cancel(tid)

    @endpoint
    def set_capacity(self, capacity: dict[str, float]) -> None:
        self.rt.set_capacity(capacity)

    @endpoint
    def exit_process(self) -> None:
        """This process belongs to one member of a group's mesh, which was killed (a slice of a proc mesh cannot
        be stopped): end it."""
        self.rt.stop()
        os._exit(0)

    @endpoint
    def spmd_master(self) -> tuple[str, int]:
        """This host's address and a TCP port free on it now (MASTER_ADDR and MASTER_PORT of an SPMD group whose
        rank 0 is here)."""
        from fray.net import free_port

        return self.rt.bind, free_port(self.rt.bind)

    @endpoint
    def unqueue(self, count: int) -> list[str]:
        return self.rt.unqueue(count)

    @endpoint
    def stop_stream(self, sid: str) -> None:
        """The consumer of a stream produced in this process has gone (handled here, not by the producing actor,
        which is busy running the generator)."""
        self.rt.stop_stream(sid)

    @endpoint(explicit_response_port=True)
    def watch(self, port: Any) -> None:
        self.watchers.append(port)  # never answered: the caller's future fails when this process dies

    @endpoint
    def state(self) -> dict[str, Any]:
        return self.rt.state()

    @endpoint
    def ping(self) -> ProcInfo:
        return ProcInfo(os.getpid(), _runtime.machine_id())
