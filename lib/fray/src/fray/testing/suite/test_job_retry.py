"""Retry in place: a finished job started again with its recorded command, callable and options."""

from __future__ import annotations

import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest

from fray import JobStatus
from fray.cluster_context import ClusterContext
from fray.errors import FrayError
from fray.testing import job_workloads as w

PY = shlex.quote(sys.executable)
TIMEOUT = 120


def test_a_failed_command_retried_in_place_runs_again_as_submitted(
    fray_cluster: ClusterContext, tmp_path: Path
) -> None:
    fixed = tmp_path / "fixed"
    code = f"import os, sys; sys.exit(0 if os.path.exists({str(fixed)!r}) else 3)"
    job = fray_cluster.create_job(f"{PY} -c {shlex.quote(code)}", stop_grace=2.5)
    first = job.wait(TIMEOUT, raise_on_failure=False)
    assert first.status is JobStatus.FAILED and first.exit_code == 3
    fixed.touch()  # the cause fixed, the job runs again as it was
    again = job.retry()
    assert again.id != job.id
    info = again.wait(TIMEOUT)
    assert info.entrypoint == first.entrypoint and "--grace 2.5" in info.entrypoint
    assert fray_cluster.get_job(job).status is JobStatus.FAILED  # the first run stays as it ended


def test_a_named_callable_job_retried_is_its_next_run(fray_cluster: ClusterContext) -> None:
    name = f"retry-{uuid.uuid4().hex[:8]}"
    job = fray_cluster.create_job(w.add, args=(2,), kwargs={"b": 5}, name=name, replicas=2)
    assert job.result(TIMEOUT) == {"sum": 7, "rank": 0}
    again = fray_cluster.retry_job(name)  # by name: its latest run
    assert again.id == f"{name}.2"
    info = again.wait(TIMEOUT)
    assert info.result == {"sum": 7, "rank": 0} and info.replicas == 2


def test_a_running_job_is_not_retried(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(f"{PY} -c 'import time; time.sleep(300)'", name=f"busy-{uuid.uuid4().hex[:8]}")
    deadline = time.monotonic() + 60
    while job.status() is JobStatus.PENDING and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(FrayError, match="wait for it or stop it first"):
        job.retry()
    job.stop()
