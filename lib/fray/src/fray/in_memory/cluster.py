"""The in_memory ClusterContext: each job is a subprocess of this machine (see fray.jobs.LocalJobs)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from fray import watchdog
from fray.capabilities import Capability
from fray.context import ClusterContext
from fray.jobs import LocalJobs
from fray.types import JobInfo, RuntimeEnv


class InMemoryClusterContext(ClusterContext):
    backend = "in_memory"
    # packages: pip install --target into the job's own directory; resources: held against this host's totals
    capabilities = frozenset({Capability.JOB_PACKAGES, Capability.JOB_RESOURCES})

    def __init__(self, root: str | None = None) -> None:
        self._own_root = root is None
        self._root = Path(root) if root else Path(tempfile.mkdtemp(prefix="fray-jobs-"))
        if self._own_root:
            watchdog.watch_path(str(self._root))  # removed with this process however it ends
        self._jobs = LocalJobs(self._root)

    def _create_job(self, entrypoint: str | list[str], env: RuntimeEnv) -> str:
        return self._jobs.start(entrypoint, env)

    def _list_jobs(self) -> list[JobInfo]:
        return self._jobs.list()

    def _get_job(self, job_id: str) -> JobInfo:
        return self._jobs.info(job_id)

    def _delete_job(self, job_id: str) -> None:
        self._jobs.delete(job_id)

    def _get_job_logs(self, job_id: str) -> str:
        return self._jobs.logs(job_id)

    def _wait_job(self, job_id: str, timeout: float | None) -> JobInfo:
        return self._jobs.wait(job_id, timeout)

    def _shutdown(self) -> None:
        self._jobs.close()
        if self._own_root:
            shutil.rmtree(self._root, ignore_errors=True)
            watchdog.forget_path(str(self._root))
