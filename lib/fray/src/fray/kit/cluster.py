"""The kit's ClusterContext: each job is a subprocess of this machine (in_memory's, and any kit backend's).

A job that is not detached belongs to this context (fray.jobs.local.LocalJobs: it ends with this process, however it
ends). A detached job lives in the state directory (fray.jobs.detached.DetachedJobs) with a runner process of its own:
it outlives this process, and any context of any process lists, follows, stops and deletes it.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fray.cluster_context import ClusterContext
from fray.errors import InfeasibleResourcesError, JobExistsError, JobNotFoundError
from fray.host import watchdog
from fray.jobs.detached import DetachedJobs
from fray.jobs.local import LocalJobs, host_resources
from fray.runtime.capabilities import Capability
from fray.runtime.gpus import HostGpus
from fray.runtime.resources import format_resources
from fray.types import JobInfo, RuntimeEnv


class LocalClusterContext(ClusterContext):
    """Jobs as subprocesses of this machine; a subclass names its backend (`backend = "..."`)."""

    # packages: pip install --target into the job's own directory; resources: held against this host's totals;
    # persistent: detached jobs are kept in the state directory
    capabilities = frozenset({Capability.JOB_PACKAGES, Capability.JOB_RESOURCES, Capability.PERSISTENT_JOBS})

    def __init__(self, root: str | None = None, state_dir: str | None = None, gpus: HostGpus | None = None) -> None:
        self._own_root = root is None
        self._root = Path(root) if root else Path(tempfile.mkdtemp(prefix="fray-jobs-"))
        if self._own_root:
            watchdog.watch_path(str(self._root))  # removed with this process however it ends
        self._jobs = LocalJobs(self._root, gpus=gpus)
        # state_dir None: the state directory of the moment (FRAY_STATE_DIR is read at each use)
        self._detached = DetachedJobs(Path(state_dir) / "jobs" if state_dir else None)
        self._tied: dict[str, list[int]] = {}

    def _table(self, job_id: str) -> LocalJobs | DetachedJobs:
        return self._jobs if self._jobs.has(job_id) else self._detached

    def _create_job(
        self, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str, detached: bool, job_id: str | None
    ) -> str:
        # One id, one job, across both tables (each table's own start is what makes it atomic)
        if job_id is not None and (self._jobs.has(job_id) or self._detached.has(job_id)):
            raise JobExistsError(f"a job with id {job_id!r} exists")
        if not detached:
            return self._jobs.start(entrypoint, env, job_id=job_id, working_dir=working_dir)
        # Detached jobs are not queued for resources (no process holds a ledger across processes): a request the
        # host could never satisfy is refused, others start at once.
        need = {r.name: float(r.quantity) for r in env.minimum_resources}
        totals = self._jobs.totals
        if any(totals.get(name, 0.0) < qty for name, qty in need.items()):
            raise InfeasibleResourcesError(
                f"the job needs {format_resources(need)} but this host has {format_resources(totals)}; lower its "
                "minimum_resources"
            )
        return self._detached.start(entrypoint, env, working_dir, job_id)

    def _list_jobs(self) -> list[JobInfo]:
        own = self._jobs.list()
        seen = {info.id for info in own}
        return own + [info for info in self._detached.list() if info.id not in seen]

    def _get_job(self, job_id: str) -> JobInfo:
        return self._table(job_id).info(job_id)

    def _stop_job(self, job_id: str) -> None:
        self._table(job_id).stop(job_id)

    def _delete_job(self, job_id: str) -> None:
        self._table(job_id).delete(job_id)
        self._untie_job(job_id)

    def _get_job_logs(self, job_id: str) -> str:
        return self._table(job_id).logs(job_id)

    def _get_job_log_end(self, job_id: str, lines: int) -> str:
        return self._table(job_id).log_end(job_id, lines)

    def _tail_job_logs(self, job_id: str) -> Iterator[str]:
        return self._table(job_id).tail(job_id)

    def _wait_job(self, job_id: str, timeout: float | None) -> JobInfo:
        return self._table(job_id).wait(job_id, timeout)

    def _tie_job(self, job_id: str) -> None:
        if not self._detached.has(job_id) or job_id in self._tied:
            return
        groups = self._detached.processes(job_id)  # its runner's group (which stops the job) and the job's own
        for pgid in groups:
            watchdog.watch_group(pgid)
        self._tied[job_id] = groups

    def _untie_job(self, job_id: str) -> None:
        for pgid in self._tied.pop(job_id, []):
            watchdog.forget_group(pgid)

    def node_status(self) -> list[dict[str, Any]]:
        """This machine: its CPUs and memory, and what is free now (CPUs: the count minus the 1-minute load
        average; memory: what the kernel reports as available)."""
        return [local_node_status(self._jobs.totals)]

    def describe(self) -> dict[str, str]:
        """Where detached jobs are kept (other `fray` commands find them there)."""
        return {"state_dir": str(self._detached.root.parent)}

    def _shutdown(self) -> None:
        for job_id in list(self._tied):  # tied: to end with this process, like a job that is not detached
            try:
                self._detached.stop(job_id)
            except JobNotFoundError:  # deleted by someone else meanwhile
                pass
            self._untie_job(job_id)
        self._jobs.close()
        self._detached.close()
        if self._own_root:
            shutil.rmtree(self._root, ignore_errors=True)
            watchdog.forget_path(str(self._root))


def local_node_status(totals: dict[str, float] | None = None) -> dict[str, Any]:
    """{"node", "total", "free"} for this machine."""
    total = dict(totals or host_resources())
    free: dict[str, float] = {}
    try:
        free["CPU"] = max(0.0, round(total.get("CPU", 0.0) - os.getloadavg()[0], 2))
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free["memory"] = float(line.split()[1]) * 1024
    except OSError:
        pass
    return {"node": socket.gethostname(), "total": total, "free": free}
