"""Jobs as training runs: callables, names, retries, ranks, resources per rank, handles, tails."""

from __future__ import annotations

import os
import shlex
import sys
import threading
import time
from pathlib import Path

import pytest

import fray
from fray import JobNotFoundError, JobStatus, RuntimeEnv
from fray.cluster_context import ClusterContext
from fray.context import JobContext
from fray.errors import InfeasibleResourcesError, JobExistsError, JobFailedError, SerializationError
from fray.host.procfs import alive
from fray.runtime.capabilities import Capability
from fray.testing import job_workloads as w
from fray.testing import requires_capability

PY = shlex.quote(sys.executable)
TIMEOUT = 120


def _python(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


def test_a_callable_jobs_value_is_on_its_record(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(w.add, args=(2,), kwargs={"b": 5})
    info = job.wait(TIMEOUT)
    assert info.status is JobStatus.SUCCEEDED
    assert info.result == {"sum": 7, "rank": 0}
    assert job.result() == {"sum": 7, "rank": 0}
    assert [a.number for a in info.attempts] == [1] and info.attempts[0].exit_code == 0
    assert "adding 2 and 5 in rank 0" in job.logs()
    assert fray_cluster.get_job(job).result == {"sum": 7, "rank": 0}  # from any context, by id
    info = fray_cluster.create_job(w.opaque).wait(TIMEOUT)  # a value that is not plain data: kept as its repr
    assert info.result is None
    assert "Opaque(42)" in info.message


def test_a_callable_jobs_exception_is_on_its_record(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(w.fail, args=("bad input 42",))
    with pytest.raises(JobFailedError, match="ValueError: bad input 42") as raised:
        job.wait(TIMEOUT)
    info = raised.value.info
    assert info.status is JobStatus.FAILED
    assert info.error is not None and info.error.type == "ValueError" and info.error.message == "bad input 42"
    assert "in fail" in info.error.traceback
    assert job.wait(TIMEOUT, raise_on_failure=False).status is JobStatus.FAILED
    assert "ValueError: bad input 42" in job.logs()  # the traceback is in the log too


def test_a_callable_that_cannot_travel_is_refused_at_submission(fray_cluster: ClusterContext) -> None:
    with pytest.raises(SerializationError, match="lock"):
        fray_cluster.create_job(w.holds_a_lock())
    with pytest.raises(SerializationError, match="argument 0"):
        fray_cluster.create_job(w.add, args=(threading.Lock(),))
    with pytest.raises(ValueError, match="by path"):
        fray_cluster.create_job(w.add, args=(b"x" * 200_000,))
    with pytest.raises(TypeError, match="callable"):
        fray_cluster.create_job("true", args=(1,))


def test_ranks_get_the_variables_of_torch_distributed(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(
        _python(
            "import os; print('seen', os.environ['RANK'], os.environ['WORLD_SIZE'], "
            "os.environ['LOCAL_RANK'], os.environ['MASTER_ADDR'], "
            "os.environ['MASTER_PORT'])"
        ),
        replicas=3,
    )
    info = job.wait(TIMEOUT)
    assert info.replicas == 3
    logs = job.logs()
    ports = set()
    for rank in range(3):
        line = next(x for x in logs.splitlines() if x.startswith(f"[rank {rank}] seen"))
        seen_rank, world, local, addr, port = line.split()[3:]  # after "[rank N] seen"
        assert (seen_rank, world, local) == (str(rank), "3", str(rank)) and addr
        ports.add(port)
    assert len(ports) == 1


def test_a_failed_attempt_is_retried_and_every_attempt_is_on_the_record(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(w.fail_first_attempt_on_rank, args=(1,), replicas=2, max_retries=2)
    info = job.wait(TIMEOUT)
    assert info.status is JobStatus.SUCCEEDED, job.logs()
    assert [(a.number, a.status) for a in info.attempts] == [(1, JobStatus.FAILED), (2, JobStatus.SUCCEEDED)]
    assert info.attempts[0].exit_code == 1 and "rank 1" in info.attempts[0].message
    assert all(a.start_time and a.end_time and a.end_time >= a.start_time for a in info.attempts)
    assert info.result == "attempt 2"
    logs = job.logs()
    first, separator, second = logs.partition("[fray] attempt 2 of 3")
    assert separator, logs
    assert "rank 1 attempt 1" in first and "rank 1 attempt 2" in second
    ran_out = fray_cluster.create_job(_python("import sys; sys.exit(3)"), max_retries=2)
    info = ran_out.wait(TIMEOUT, raise_on_failure=False)
    assert info.status is JobStatus.FAILED
    assert [a.exit_code for a in info.attempts] == [3, 3, 3] and info.exit_code == 3


def test_a_two_rank_gloo_job_fails_once_then_succeeds(fray_cluster: ClusterContext) -> None:
    pytest.importorskip("torch.distributed", reason="torch is not installed here: no gloo")
    job = fray_cluster.create_job(w.gloo_allreduce, args=(1,), replicas=2, max_retries=1)
    info = job.wait(TIMEOUT)
    assert info.status is JobStatus.SUCCEEDED, job.logs()
    assert len(info.attempts) == 2 and info.result == 3.0


def test_one_rank_failing_stops_the_others(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    pid_file = tmp_path / "rank0.pid"
    job = fray_cluster.create_job(w.sleep_forever_in_rank_0_fail_in_rank_1, args=(str(pid_file),), replicas=2)
    info = job.wait(TIMEOUT, raise_on_failure=False)
    assert info.status is JobStatus.FAILED
    assert info.error is not None and info.error.rank == 1 and info.error.type == "RuntimeError"
    rank0 = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(rank0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(rank0), "rank 0 still runs after rank 1 failed"


def test_a_stopped_job_is_not_retried(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(_python("import time; print('up', flush=True); time.sleep(300)"), max_retries=3)
    deadline = time.monotonic() + 60
    while "up" not in job.logs() and time.monotonic() < deadline:
        time.sleep(0.1)
    job.stop()
    info = fray_cluster.get_job(job)
    assert info.status is JobStatus.STOPPED
    assert len(info.attempts) <= 1
    with pytest.raises(JobFailedError, match="STOPPED"):
        job.wait(TIMEOUT)


def test_a_name_is_one_live_job(fray_cluster: ClusterContext) -> None:
    name = f"train-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    first = fray_cluster.create_job(_python("import time; time.sleep(300)"), name=name)
    assert first == f"{name}.1"
    again = fray_cluster.create_job("true", name=name)
    assert again == first  # returned, not started again
    with pytest.raises(JobExistsError, match="refuse"):
        fray_cluster.create_job("true", name=name, if_exists="refuse")
    assert fray_cluster.get_job(name).id == first and fray_cluster.get_job(name).name == name
    replaced = fray_cluster.create_job(_python("print('second run')"), name=name, if_exists="replace")
    assert replaced == f"{name}.2"
    assert fray_cluster.get_job(first).status is JobStatus.STOPPED
    assert fray_cluster.wait_job(name, TIMEOUT).status is JobStatus.SUCCEEDED  # a name: its latest run
    assert "second run" in fray_cluster.get_job_logs(name)
    third = fray_cluster.create_job("true", name=name)  # its runs have ended: a new one
    assert third == f"{name}.3"
    third.wait(TIMEOUT)
    names = {info.id: info.name for info in fray_cluster.list_jobs()}
    assert names[first] == names[replaced] == names[third] == name
    fray_cluster.delete_job(name)  # the latest run
    assert fray_cluster.job(name) == replaced
    fray_cluster.delete_job(replaced)
    fray_cluster.delete_job(first)
    with pytest.raises(JobNotFoundError):
        fray_cluster.job(name)
    assert fray_cluster.create_job("true", name=name) == f"{name}.1"  # a deleted run's id is free again


def test_concurrent_submissions_of_one_name_make_one_job(fray_cluster: ClusterContext) -> None:
    name = f"race-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    made: list[str] = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            for _ in range(5):
                made.append(fray_cluster.create_job(_python("import time; time.sleep(60)"), name=name))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not errors, errors
    assert set(made) == {f"{name}.1"} and len(made) == 20
    assert [i.id for i in fray_cluster.list_jobs() if i.name == name] == [f"{name}.1"]
    fray_cluster.stop_job(name)


def test_bad_job_input_is_refused_clearly(fray_cluster: ClusterContext) -> None:
    with pytest.raises(JobNotFoundError, match="no-such-job"):
        fray_cluster.get_job("no-such-job")
    with pytest.raises(JobNotFoundError):
        fray_cluster.job("no-such-job")
    with pytest.raises(ValueError, match="max_retries"):
        fray_cluster.create_job("true", max_retries=-1)
    with pytest.raises(ValueError, match="replicas"):
        fray_cluster.create_job("true", replicas=0)
    with pytest.raises(ValueError, match="job name"):
        fray_cluster.create_job("true", name="has a space")
    with pytest.raises(ValueError, match="job name"):
        fray_cluster.create_job("true", name="dotted.name")
    with pytest.raises(ValueError, match="if_exists"):
        fray_cluster.create_job("true", name="x", if_exists="sometimes")
    with pytest.raises(ValueError, match="tail"):
        fray_cluster.get_job_logs("x", tail=-1)


@requires_capability("job_resources")
def test_ranks_larger_than_the_cluster_are_infeasible(fray_cluster: ClusterContext) -> None:
    with pytest.raises(InfeasibleResourcesError):
        fray_cluster.create_job("true", replicas=4096, resources={"CPU": 1})


@requires_capability("job_resources")
def test_resources_per_rank_are_held_for_all_ranks(fray_cluster: ClusterContext) -> None:
    job = fray_cluster.create_job(_python("print('ok')"), replicas=2, resources={"CPU": 0.5})
    assert job.wait(TIMEOUT).status is JobStatus.SUCCEEDED
    with pytest.raises(ValueError, match="once"):
        fray_cluster.create_job(
            "true", resources={"CPU": 1}, env=RuntimeEnv(minimum_resources=[fray.Resource("CPU", 1)])
        )


def test_logs_tail_gives_the_last_lines(fray_cluster: ClusterContext) -> None:
    code = "import sys\nfor i in range(400000): sys.stdout.write(f'line {i}\\n')\n"  # ~5 MB
    job = fray_cluster.create_job(_python(code))
    job.wait(TIMEOUT)
    last = job.logs(tail=100)
    assert last.splitlines() == [f"line {i}" for i in range(399900, 400000)]
    assert job.logs(tail=0) == ""
    assert fray_cluster.get_job_logs(job, tail=3).splitlines() == ["line 399997", "line 399998", "line 399999"]


def test_follow_ends_with_the_job_and_wait_jobs_waits_for_all(fray_cluster: ClusterContext) -> None:
    jobs = [fray_cluster.create_job(_python(f"print('job {i}')")) for i in range(3)]
    assert "job 0" in "".join(jobs[0].follow())
    infos = fray.wait_jobs(jobs, timeout=TIMEOUT)
    assert [i.status for i in infos] == [JobStatus.SUCCEEDED] * 3
    failing = fray_cluster.create_job(_python("import sys; sys.exit(2)"))
    with pytest.raises(JobFailedError, match="code 2"):
        fray.wait_jobs([*jobs, failing], timeout=TIMEOUT)
    assert fray.wait_jobs([failing], timeout=TIMEOUT, raise_on_failure=False)[0].exit_code == 2


def test_ranks_placed_as_a_group_of_the_backend(fray_cluster: ClusterContext, fray_ctx: JobContext) -> None:
    """placement="pack": the ranks are an SPMD group of the job's own backend (the way ranks reach other
    nodes), with torch.distributed's variables set by it, their output in the job's log, and a failed attempt
    retried as a whole."""
    if Capability.SPMD_GROUPS not in fray_ctx.capabilities:  # (a capability of the backend's job contexts)
        pytest.skip(f"backend {fray_ctx.backend!r} lacks capability 'spmd_groups': ranks over nodes are a group")
    job = fray_cluster.create_job(
        w.env_after_failing_once_on_rank, args=(1,), replicas=2, max_retries=1, resources={"CPU": 0.5}, placement="pack"
    )
    info = job.wait(TIMEOUT)
    assert info.status is JobStatus.SUCCEEDED, job.logs()
    assert [a.status for a in info.attempts] == [JobStatus.FAILED, JobStatus.SUCCEEDED]
    assert info.attempts[0].exit_code == 1 and "rank 1" in info.attempts[0].message
    env = info.result  # rank 0's, at attempt 2: the group set torch.distributed's variables
    assert (env["RANK"], env["WORLD_SIZE"], env["FRAY_JOB_ATTEMPT"]) == ("0", "2", "2") and env["MASTER_PORT"]
    logs = job.logs()
    assert "[rank 1] rank 1 attempt 1" in logs and "[rank 0] rank 0 attempt 2" in logs, logs
    with pytest.raises(ValueError, match="placement"):
        fray_cluster.create_job("true", replicas=2, placement="everywhere")


def test_one_rank_failing_stops_the_others_in_a_group(
    fray_cluster: ClusterContext, fray_ctx: JobContext, tmp_path: Path
) -> None:
    """As test_one_rank_failing_stops_the_others, with the ranks a group of the backend (placement="pack"):
    when rank 1 fails, rank 0's member is killed and its rank, a process of its own group, goes with it."""
    if Capability.SPMD_GROUPS not in fray_ctx.capabilities:
        pytest.skip(f"backend {fray_ctx.backend!r} lacks capability 'spmd_groups': ranks over nodes are a group")
    pid_file = tmp_path / "rank0.pid"
    job = fray_cluster.create_job(
        w.sleep_forever_in_rank_0_fail_in_rank_1,
        args=(str(pid_file),),
        replicas=2,
        resources={"CPU": 0.5},
        placement="pack",
    )
    info = job.wait(TIMEOUT, raise_on_failure=False)
    assert info.status is JobStatus.FAILED and info.error is not None and info.error.rank == 1, job.logs()
    rank0 = int(pid_file.read_text())
    deadline = time.monotonic() + 15
    while alive(rank0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(rank0), "rank 0 still runs after rank 1 failed"
