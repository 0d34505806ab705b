"""Jobs' attempts as classes (succeeded / failed / lost / stopped) with their own budgets, and the grace a rank has
between SIGTERM and SIGKILL: with real processes, signalled from outside as a scheduler or a user would."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fray import JobStatus, RuntimeEnv
from fray.cluster_context import ClusterContext
from fray.context import JobContext
from fray.host.procfs import alive
from fray.jobs.handle import JobHandle
from fray.runtime.capabilities import Capability
from fray.testing import job_workloads as w
from fray.testing import requires_capability

PY = shlex.quote(sys.executable)
TIMEOUT = 120


def _pids(path: Path) -> tuple[int, int]:
    """(rank, supervisor) pids that wait_to_be_signalled_once wrote."""
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"the job wrote no {path.name} within 60 s"
        time.sleep(0.05)
    rank, supervisor = map(int, path.read_text().split())
    return rank, supervisor


def _kill_from_outside(pid: int, signum: int) -> None:
    """Signal `pid` from a process of its own (`kill`): a sender that is not the job's backend, as a scheduler."""
    subprocess.run(["kill", f"-{signal.Signals(signum).name[3:]}", str(pid)], check=True)


def _signalled(cluster: ClusterContext, path: Path, signum: int, whom: str, **options: object) -> JobHandle:
    job = cluster.create_job(w.wait_to_be_signalled_once, args=(str(path),), **options)  # type: ignore[arg-type]
    rank, supervisor = _pids(path)
    _kill_from_outside(rank if whom == "rank" else supervisor, signum)
    return job


def test_a_rank_killed_is_a_failure_counted_against_max_retries(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    job = _signalled(fray_cluster, tmp_path / "pids", signal.SIGKILL, "rank", max_retries=1)
    info = job.wait(TIMEOUT)
    assert [(a.number, a.outcome) for a in info.attempts] == [(1, "failed"), (2, "succeeded")]
    assert info.attempts[0].exit_code == -signal.SIGKILL and "SIGKILL" in info.attempts[0].message
    assert info.result == {"attempt": 2}
    spent = _signalled(fray_cluster, tmp_path / "pids-2", signal.SIGKILL, "rank")  # max_retries=0: it ends
    info = spent.wait(TIMEOUT, raise_on_failure=False)
    assert info.status is JobStatus.FAILED
    assert [a.outcome for a in info.attempts] == ["failed"]


def test_a_rank_sigtermed_from_outside_is_lost_not_a_failure(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    job = _signalled(fray_cluster, tmp_path / "pids", signal.SIGTERM, "rank")  # max_retries=0
    info = job.wait(TIMEOUT)
    assert [(a.number, a.outcome) for a in info.attempts] == [(1, "lost"), (2, "succeeded")]
    assert "preempted" in info.attempts[0].message and info.attempts[0].status is JobStatus.FAILED
    assert info.result == {"attempt": 2}


def test_a_preempted_supervisor_recovers_within_max_recoveries(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    job = _signalled(fray_cluster, tmp_path / "pids", signal.SIGTERM, "supervisor")
    info = job.wait(TIMEOUT)
    assert [a.outcome for a in info.attempts] == ["lost", "succeeded"]
    assert "the supervisor got SIGTERM" in info.attempts[0].message
    assert info.attempts[0].grace is not None  # its rank had the grace (and ended at its SIGTERM)
    spent = _signalled(fray_cluster, tmp_path / "pids-2", signal.SIGTERM, "supervisor", max_recoveries=0)
    info = spent.wait(TIMEOUT, raise_on_failure=False)
    assert info.status is JobStatus.FAILED
    assert [a.outcome for a in info.attempts] == ["lost"]


def test_exit_code_lists_say_which_failures_are_retried(fray_cluster: ClusterContext) -> None:
    codes = f"{PY} -c 'import os, sys; sys.exit([3, 4, 0][int(os.environ[\"FRAY_JOB_ATTEMPT\"]) - 1])'"
    only = fray_cluster.create_job(codes, max_retries=5, retry_on_exit_codes=[3])
    but = fray_cluster.create_job(codes, max_retries=5, no_retry_on_exit_codes=[4])
    every = fray_cluster.create_job(codes, max_retries=5)
    for job in (only, but):
        info = job.wait(TIMEOUT, raise_on_failure=False)
        assert info.status is JobStatus.FAILED
        assert [(a.outcome, a.exit_code) for a in info.attempts] == [("failed", 3), ("failed", 4)]
    assert [a.outcome for a in every.wait(TIMEOUT).attempts] == ["failed", "failed", "succeeded"]


def _stopped_with_grace(
    cluster: ClusterContext,
    tmp_path: Path,
    replicas: int,
    takes: float = 5.5,
    start_within: float = 60.0,
    **options: object,
) -> None:
    """A job whose ranks take `takes` s to write a checkpoint in their SIGTERM handler (by default longer than the
    default grace, 5 s), stopped with stop_grace=15: every rank's checkpoint is written, the attempt is "stopped"
    (not retried) and its grace on the record."""
    checkpoint, ready = tmp_path / "checkpoint", tmp_path / "ready"
    job = cluster.create_job(
        w.checkpoint_on_sigterm,
        args=(str(checkpoint), str(ready), takes),
        stop_grace=15,
        max_retries=2,
        replicas=replicas,
        **options,  # type: ignore[arg-type]
    )
    deadline = time.monotonic() + start_within
    while not all(Path(f"{ready}.{rank}").exists() for rank in range(replicas)):
        started = time.monotonic() < deadline
        assert started, f"the job did not start within {start_within:.0f} s: {job.info()}\n{job.logs()}"
        time.sleep(0.05)
    job.stop()
    info = cluster.get_job(job)
    assert info.status is JobStatus.STOPPED
    for rank in range(replicas):
        assert Path(f"{checkpoint}.{rank}").read_text() == "step 42 of attempt 1"
    assert [a.outcome for a in info.attempts] == ["stopped"]  # a stop is not retried
    grace = info.attempts[0].grace
    # (timed from when the supervisor heard of the stop: Ray's own SIGTERM reaches the rank a moment before)
    assert grace is not None and takes - 1 <= grace < 15, grace
    assert not list(tmp_path.glob("*.tmp"))


def test_a_stopped_job_has_its_grace_to_write_a_checkpoint(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    _stopped_with_grace(fray_cluster, tmp_path, 1)


def test_ranks_placed_as_a_group_have_their_grace_too(
    fray_cluster: ClusterContext, fray_ctx: JobContext, tmp_path: Path
) -> None:
    if Capability.SPMD_GROUPS not in fray_ctx.capabilities:
        pytest.skip(f"backend {fray_ctx.backend!r} lacks capability 'spmd_groups': ranks over nodes are a group")
    _stopped_with_grace(fray_cluster, tmp_path, 2, resources={"CPU": 0.5}, placement="pack")


def test_what_a_failed_rank_left_running_ends_with_its_attempt(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    info = fray_cluster.create_job(w.die_leaving_a_child, args=(str(pid_file),), max_retries=1).wait(TIMEOUT)
    assert [a.outcome for a in info.attempts] == ["failed", "succeeded"] and info.result == 2
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the child a killed rank left behind still runs"


@requires_capability("job_packages")
def test_a_job_with_packages_has_its_grace_too(
    fray_cluster: ClusterContext, tmp_path: Path, probe_ok_wheel: Path
) -> None:
    """With packages, the job's command installs them first, in a shell: its stop must still reach the supervisor
    alone, which gives the ranks their grace (a shell in between would end at the SIGTERM, and the job with it)."""
    # (its start installs the packages first: on Ray a virtualenv is built, tens of seconds on a loaded machine)
    packages = RuntimeEnv(package_requirements=[str(probe_ok_wheel)])
    _stopped_with_grace(fray_cluster, tmp_path, 1, 2.0, start_within=180.0, env=packages)
