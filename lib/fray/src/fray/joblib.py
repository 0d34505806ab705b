"""joblib on fray: `fray.joblib.register()`, then `with joblib.parallel_config(backend="fray"):` runs joblib's
`Parallel` (and so scikit-learn's `n_jobs`) as tasks of the current fray job context, on any backend.

Needs joblib (`pip install 'fray-core[joblib]'`). Each batch joblib makes is one task; `n_jobs=-1` means as many
batches at once as the cluster has CPUs for. Parallel calls nested inside a task use joblib's own default there
(threads), as joblib's process backends do.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

try:
    from joblib import register_parallel_backend
    from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase
except ImportError as exc:  # an optional extra
    raise ImportError("fray.joblib needs joblib: pip install 'fray-core[joblib]'") from exc

from fray.context import JobContext, get_job_context
from fray.executor import FrayExecutor, cluster_slots
from fray.types import TaskOptions

__all__ = ["FrayBackend", "register"]


def register(name: str = "fray") -> None:
    """Make `joblib.parallel_config(backend=name)` run on the fray context current when Parallel starts."""
    register_parallel_backend(name, FrayBackend)


class FrayBackend(AutoBatchingMixin, ParallelBackendBase):  # type: ignore[misc]  # joblib has no type hints
    """A joblib backend whose batches are fray tasks (task options: `parallel_config(backend="fray",
    resources={"CPU": 2})` passes them through)."""

    supports_retrieve_callback = True
    supports_timeout = True

    def __init__(self, nesting_level: int | None = None, inner_max_num_threads: int | None = None, **options: Any):
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        self._task_options = TaskOptions(**options)
        self._executor: FrayExecutor | None = None

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:  # joblib's convention: -1 all, -2 all but one...
            return max(cluster_slots(_context(), self._task_options) + 1 + n_jobs, 1)
        return int(n_jobs)

    def configure(self, n_jobs: int = 1, parallel: Any = None, **backend_kwargs: Any) -> int:
        n = self.effective_n_jobs(n_jobs)
        self.parallel = parallel
        self._executor = FrayExecutor(_context(), self._task_options, max_workers=n)
        return n

    def submit(self, func: Any, callback: Any = None) -> Future[Any]:
        if self._executor is None:
            raise RuntimeError("the fray joblib backend was not configured (joblib calls configure first)")
        future = self._executor.submit(func)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, future: Future[Any]) -> Any:
        return future.result()

    def terminate(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self.reset_batch_stats()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """An error in one batch: the batches still queued are not started (running ones end by themselves)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if ensure_ready:
            self.configure(n_jobs=self.parallel.n_jobs, parallel=self.parallel)


def _context() -> JobContext:
    return get_job_context()
