"""Local subprocess jobs: the whole process group stops, output never blocks the job."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

import fray
from fray import JobStatus, RuntimeEnv
from fray.host import procfs
from fray.jobs.local import LocalJobs


def _alive(pid: int) -> bool:
    return procfs.alive(pid)  # a zombie is dead for our purposes


def test_delete_stops_grandchildren(tmp_path: Path) -> None:
    jobs = LocalJobs(tmp_path, stop_grace=1.0)
    pid_file = tmp_path / "grandchild.pid"
    job = jobs.start(f"sleep 300 & echo $! > {pid_file}; wait", RuntimeEnv())
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    assert _alive(grandchild)
    jobs.delete(job)
    deadline = time.monotonic() + 10
    while _alive(grandchild):
        assert time.monotonic() < deadline, "the job's background child survived delete"
        time.sleep(0.05)
    with pytest.raises(KeyError):
        jobs.info(job)


def test_stopped_job_is_stopped_and_sigterm_ignoring_job_is_killed(tmp_path: Path) -> None:
    jobs = LocalJobs(tmp_path, stop_grace=0.5)
    job = jobs.start(
        [
            "python3",
            "-c",
            "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(300)",
        ],
        RuntimeEnv(),
    )
    deadline = time.monotonic() + 10
    while "up" not in jobs.logs(job):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    jobs.stop(job)
    assert jobs.wait(job, timeout=10).status is JobStatus.STOPPED


def test_unstartable_argv_fails_with_reason(tmp_path: Path) -> None:
    jobs = LocalJobs(tmp_path)
    job = jobs.start(["/nonexistent/binary"], RuntimeEnv())
    assert jobs.wait(job, timeout=10).status is JobStatus.FAILED
    assert "could not start" in jobs.logs(job)


def test_minimum_resources_queue_jobs_and_infeasible_is_refused(tmp_path: Path) -> None:
    from fray import InfeasibleResourcesError, Resource

    jobs = LocalJobs(tmp_path, stop_grace=1.0, totals={"CPU": 1})
    one_cpu = RuntimeEnv(minimum_resources=[Resource("CPU", 1)])
    with pytest.raises(InfeasibleResourcesError):
        jobs.start("true", RuntimeEnv(minimum_resources=[Resource("CPU", 2)]))
    first = jobs.start("sleep 60", one_cpu)  # holds the CPU until stopped below: no race with its end
    second = jobs.start("echo second ran", one_cpu)
    third = jobs.start("echo never", one_cpu)
    deadline = time.monotonic() + 30
    while jobs.info(first).status is not JobStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert jobs.info(first).status is JobStatus.RUNNING
    assert jobs.info(second).status is JobStatus.PENDING  # waits for the CPU the first job holds
    jobs.stop(third)
    assert jobs.wait(third, timeout=10).status is JobStatus.STOPPED
    assert jobs.info(second).status is JobStatus.PENDING
    jobs.stop(first)
    assert jobs.wait(first, timeout=10).status is JobStatus.STOPPED
    assert jobs.wait(second, timeout=10).status is JobStatus.SUCCEEDED
    assert jobs.info(second).start_time >= jobs.info(first).end_time  # type: ignore[operator]
    assert "second ran" in jobs.logs(second)


def test_job_directories_and_logs_are_private(tmp_path: Path) -> None:
    """A job's log holds what it printed (secrets included): its directories are 0700 and its log 0600, also
    under a shared temp directory; a root that is a symlink (someone could have planted it) is refused."""
    root = tmp_path / "shared" / "fray-jobs-x"
    jobs = LocalJobs(root)
    job = jobs.start("echo secret", RuntimeEnv())
    jobs.wait(job, timeout=60)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / job).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / job / "log").st_mode) == 0o600
    jobs.close()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "planted").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(fray.FrayError, match="not a directory of this user's"):
        LocalJobs(tmp_path / "planted")


def test_a_named_run_waits_for_a_racing_submitters_job_to_be_listed(tmp_path: Path) -> None:
    """A backend may refuse an id a moment before it lists the job holding it (a detached job's directory comes
    before its record). A second submitter of the name must back off and find that job, not spend every try in
    that moment and fail with JobExistsError."""
    from fray.kit.cluster import LocalClusterContext

    class LaggingListing(LocalClusterContext):
        backend = "lagging"

        def _list_jobs(self) -> list[fray.JobInfo]:
            now = time.time()
            return [info for info in super()._list_jobs() if now - (info.submission_time or 0.0) > 0.1]

    cluster = LaggingListing(root=str(tmp_path))
    try:
        first = cluster.create_job("sleep 60", name="lag")
        assert cluster.create_job("sleep 60", name="lag", if_exists="return") == first == "lag.1"
    finally:
        cluster.stop_job("lag.1")
