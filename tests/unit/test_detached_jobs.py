"""Detached local jobs (fray.jobs.detached): state on disk, readable from any process; a dead runner is reported."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from fray import JobNotFoundError, JobStatus, RuntimeEnv
from fray.host.procfs import group_members
from fray.host.state_dir import state_dir
from fray.jobs.detached import DetachedJobs


def test_state_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FRAY_STATE_DIR", str(tmp_path / "a"))
    assert state_dir() == tmp_path / "a"
    monkeypatch.delenv("FRAY_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "fray"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "fray"


def test_a_job_whose_runner_died_is_failed_and_stop_still_ends_it(tmp_path: Path) -> None:
    jobs = DetachedJobs(tmp_path, stop_grace=1.0)
    job = jobs.start("echo up; sleep 300", RuntimeEnv(), str(tmp_path))
    assert jobs.info(job).status is JobStatus.RUNNING
    runner, pgid = jobs.processes(job)
    os.kill(runner, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while jobs.info(job).status is JobStatus.RUNNING:
        assert time.monotonic() < deadline, "a job whose runner died stayed RUNNING"
        time.sleep(0.05)
    info = jobs.info(job)
    assert info.status is JobStatus.FAILED and "runner" in info.message and "still run" in info.message, info
    assert group_members(pgid)
    jobs.stop(job)  # ends what is left of it
    assert not group_members(pgid)
    jobs.delete(job)
    with pytest.raises(JobNotFoundError):
        jobs.info(job)


def test_missing_working_dir_and_bad_ids(tmp_path: Path) -> None:
    jobs = DetachedJobs(tmp_path)
    job = jobs.start(["true"], RuntimeEnv(), str(tmp_path / "gone"))
    info = jobs.wait(job, timeout=10)
    assert info.status is JobStatus.FAILED and "does not exist" in jobs.logs(job)
    for bad in ("../x", "", "a/b", "no-such-job"):
        with pytest.raises(JobNotFoundError):
            jobs.info(bad)
    assert [i.id for i in jobs.list()] == [job]
