"""Job dependencies: `create_job(..., after=[...])` starts a job once those it waits for succeed, and ends it without
running when one of them fails, is stopped or is deleted."""

from __future__ import annotations

import shlex
import sys
import time
import uuid
from pathlib import Path

import pytest

from fray import JobStatus
from fray.cluster_context import ClusterContext
from fray.errors import GetTimeoutError, JobFailedError, JobNotFoundError, UnsupportedFeatureError

PY = shlex.quote(sys.executable)
TIMEOUT = 120


def _appends(path: Path, word: str, exit_code: int = 0, sleep: float = 0.0) -> str:
    """A command that waits `sleep` seconds, appends `word` to `path` and exits with `exit_code`."""
    code = (
        f"import sys, time; time.sleep({sleep}); "
        f"open({str(path)!r}, 'a').write({word!r} + '\\n'); sys.exit({exit_code})"
    )
    return f"{PY} -c {shlex.quote(code)}"


def _sleeper() -> str:
    return f"{PY} -c {shlex.quote('import time; time.sleep(60)')}"


def test_a_chain_submitted_at_once_runs_in_order(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    ran = tmp_path / "ran"
    prep = fray_cluster.create_job(_appends(ran, "prep", sleep=1.0), name=f"prep-{tag}")
    train = fray_cluster.create_job(_appends(ran, "train"), name=f"train-{tag}", after=[prep])
    evaluate = fray_cluster.create_job(_appends(ran, "eval"), after=[f"train-{tag}"])  # a name: its latest run
    # recorded at once: listed, pending, saying what they wait for
    listed = {info.id: info for info in fray_cluster.list_jobs()}
    assert listed[train.id].status is JobStatus.PENDING and listed[train.id].waiting_for == (prep.id,)
    assert listed[evaluate.id].status is JobStatus.PENDING and listed[evaluate.id].waiting_for == (train.id,)
    assert evaluate.info().name is None and train.info().name == f"train-{tag}"
    assert fray_cluster.get_job(f"train-{tag}").id == train.id
    assert evaluate.logs() == ""  # it has not started
    with pytest.raises(GetTimeoutError, match="waits for"):
        evaluate.wait(0.1)
    ended = evaluate.wait(TIMEOUT)
    assert ended.status is JobStatus.SUCCEEDED and ended.waiting_for == ()
    assert ran.read_text().split() == ["prep", "train", "eval"]
    first, second, third = prep.info(), train.info(), evaluate.info()
    assert first.end_time is not None and second.start_time is not None and first.end_time <= second.start_time
    assert second.end_time is not None and third.start_time is not None and second.end_time <= third.start_time


def test_a_failing_middle_job_fails_the_rest_at_once(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    prep = fray_cluster.create_job(_appends(ran, "prep"))
    train = fray_cluster.create_job(_appends(ran, "train", exit_code=3), after=[prep])
    evaluate = fray_cluster.create_job(_appends(ran, "eval"), after=[train])
    with pytest.raises(JobFailedError, match=f"job {train.id}, which it waits for, ended FAILED") as raised:
        evaluate.wait(TIMEOUT)
    info = raised.value.info
    assert info.status is JobStatus.FAILED and info.start_time is None and info.waiting_for == (train.id,)
    failed = train.info()
    assert failed.status is JobStatus.FAILED and failed.end_time is not None and info.end_time is not None
    assert info.end_time - failed.end_time < 30  # at once: it is not left waiting
    assert ran.read_text().split() == ["prep", "train"]  # eval never ran
    assert evaluate.logs() == ""
    assert evaluate.id in {job.id for job in fray_cluster.list_jobs()}  # it stays listed as it ended
    fray_cluster.delete_job(evaluate)
    with pytest.raises(JobNotFoundError):
        evaluate.info()


def test_a_stopped_or_deleted_dependency_fails_its_waiters(fray_cluster: ClusterContext) -> None:
    first = fray_cluster.create_job(_sleeper())
    second = fray_cluster.create_job(_sleeper())
    stopped_waiter = fray_cluster.create_job("true", after=[first])
    deleted_waiter = fray_cluster.create_job("true", after=[second])
    first.stop()
    message = stopped_waiter.wait(TIMEOUT, raise_on_failure=False).message
    assert f"job {first.id}, which it waits for, ended STOPPED" in message
    fray_cluster.delete_job(second)  # (a backend stops it first: its waiter may see it STOPPED, then gone)
    ended = deleted_waiter.wait(TIMEOUT, raise_on_failure=False)
    assert ended.status is JobStatus.FAILED and f"job {second.id}, which it waits for, " in ended.message
    assert "was deleted" in ended.message or "ended STOPPED" in ended.message
    third = fray_cluster.create_job(_sleeper())
    middle = fray_cluster.create_job("true", after=[third])  # itself waiting
    last = fray_cluster.create_job("true", after=[middle])
    fray_cluster.delete_job(middle)
    ended = last.wait(TIMEOUT, raise_on_failure=False)
    assert ended.status is JobStatus.FAILED and f"job {middle.id}, which it waits for, was deleted" in ended.message
    third.stop()


def test_stopping_a_waiting_job_ends_its_wait(fray_cluster: ClusterContext) -> None:
    running = fray_cluster.create_job(_sleeper())
    waiting = fray_cluster.create_job("true", after=[running])
    started = time.monotonic()
    waiting.stop()
    info = waiting.wait(TIMEOUT, raise_on_failure=False)
    assert info.status is JobStatus.STOPPED and info.start_time is None
    assert f"stopped before it started (it waited for {running.id})" in info.message
    assert time.monotonic() - started < 30
    assert running.status() is not JobStatus.STOPPED  # the job it waited for goes on
    running.stop()


def test_after_naming_no_job_is_refused(fray_cluster: ClusterContext) -> None:
    missing = f"no-such-job-{uuid.uuid4().hex[:8]}"
    with pytest.raises(JobNotFoundError, match=missing):
        fray_cluster.create_job("true", after=[missing])
    with pytest.raises(TypeError, match="list of jobs"):
        fray_cluster.create_job("true", after="prep")  # type: ignore[arg-type]


def test_a_detached_job_cannot_wait_for_others(fray_cluster: ClusterContext) -> None:
    done = fray_cluster.create_job("true")
    done.wait(TIMEOUT)
    with pytest.raises(UnsupportedFeatureError, match=r"after=|persistent_jobs"):
        fray_cluster.create_job("true", detached=True, after=[done])
