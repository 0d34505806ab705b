"""JobHandle: what create_job returns. It is the job's id (a str, as create_job always returned), with the verbs of
that one job: status, wait, result, logs, follow, stop, retry. `wait_jobs` waits for several."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from fray.errors import GetTimeoutError, JobFailedError
from fray.runtime.arguments import check_timeout
from fray.types import JobInfo, JobStatus


class _Jobs(Protocol):
    """What a handle needs of its ClusterContext (a Protocol: no import of it, which imports this module)."""

    def get_job(self, job_id: str) -> JobInfo: ...
    def wait_job(self, job_id: str, timeout: float | None = None) -> JobInfo: ...
    def get_job_logs(self, job_id: str, tail: int | None = None) -> str: ...
    def tail_job_logs(self, job_id: str) -> Iterator[str]: ...
    def stop_job(self, job_id: str) -> None: ...
    def retry_job(self, job_id: str) -> JobHandle: ...


__all__ = ["JobHandle", "wait_jobs"]


def _failure(info: JobInfo) -> JobFailedError:
    what = f"job {info.id}" + (f" ({info.name})" if info.name else "")
    if info.error is not None:
        how = f"raised {info.error.type}: {info.error.message}"
        if info.error.traceback:
            how += f"\n{info.error.traceback.rstrip()}"
    else:
        how = info.message or f"exit code {info.exit_code}"
    tries = f" after {len(info.attempts)} attempts" if len(info.attempts) > 1 else ""
    return JobFailedError(f"{what} ended {info.status.value}{tries}: {how}", info)


class JobHandle(str):
    """A job's id, and its verbs. `str(handle)` and `handle == "job-..."` are the id, so a handle goes wherever an
    id does (get_job, stop_job, the `fray job` command)."""

    _cluster: _Jobs

    def __new__(cls, job_id: str, cluster: _Jobs) -> JobHandle:
        handle = super().__new__(cls, job_id)
        handle._cluster = cluster
        return handle

    @property
    def id(self) -> str:
        return str(self)

    def info(self) -> JobInfo:
        return self._cluster.get_job(self.id)

    def status(self) -> JobStatus:
        return self.info().status

    def wait(self, timeout: float | None = None, raise_on_failure: bool = True) -> JobInfo:
        """Block until the job ends (GetTimeoutError after `timeout` seconds); its JobInfo. With raise_on_failure
        a job that ended FAILED or STOPPED raises JobFailedError (for a callable, naming its exception)."""
        self._cluster.wait_job(self.id, timeout)
        info = self.info()
        if raise_on_failure and info.status is not JobStatus.SUCCEEDED:
            raise _failure(info)
        return info

    def result(self, timeout: float | None = None) -> Any:
        """A callable job's return value (rank 0's), once it has succeeded: JobFailedError if it failed."""
        return self.wait(timeout).result

    def logs(self, tail: int | None = None) -> str:
        """Its log as plain text; with `tail`, only its last `tail` lines (read from the end: cheap for any size)."""
        return self._cluster.get_job_logs(self.id, tail=tail)

    def follow(self) -> Iterator[str]:
        """Its output as it comes, ending with the job (ClusterContext.tail_job_logs)."""
        return self._cluster.tail_job_logs(self.id)

    def stop(self) -> None:
        self._cluster.stop_job(self.id)

    def retry(self) -> JobHandle:
        """Start a new run of this job, once it has ended, with its recorded command, callable and options: a named
        job's next run, else a job with a new id (ClusterContext.retry_job). FrayError while it runs."""
        return self._cluster.retry_job(self.id)

    def __reduce__(self) -> tuple[Any, ...]:  # a handle travels as its id: a context does not
        return (str, (str(self),))


def wait_jobs(jobs: Iterable[JobHandle], timeout: float | None = None, raise_on_failure: bool = True) -> list[JobInfo]:
    """Wait for every job (one timeout for all: GetTimeoutError naming those still running); their JobInfos in
    order. With raise_on_failure, JobFailedError for the first (in the given order) that did not succeed, once all
    have ended."""
    handles = list(jobs)
    check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    infos = []
    for handle in handles:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            infos.append(handle.wait(left, raise_on_failure=False))
        except GetTimeoutError:
            running = [h.id for h in handles if not h.status().is_terminal]
            raise GetTimeoutError(
                f"{len(running)} of {len(handles)} jobs still running after {timeout} s: {', '.join(running)}"
            ) from None
    if raise_on_failure:
        for info in infos:
            if info.status is not JobStatus.SUCCEEDED:
                raise _failure(info)
    return infos
