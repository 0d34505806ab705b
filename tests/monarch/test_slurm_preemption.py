"""A monarch cluster on a Slurm allocation (`job=slurm`) whose allocation Slurm preempts, on the test Slurm of the
multi-host tests (slurmctld in namespaced host 0, a slurmd in each of hosts 1 and 2), configured for preemption as
a site with preemptible capacity is: PreemptType=preempt/partition_prio, PreemptMode=REQUEUE, and a partition of the
same nodes with a higher priority tier. A whole-node job submitted there takes both nodes: Slurm signals every
process of the cluster's allocation (its host workers, the job runners, the job's supervisor and rank) and requeues
it. The driver's cluster waits for the allocation's next run, records the running attempt `lost` naming the
preemption (not counted against max_retries=0), and runs the job's next attempt there, which finds the first
attempt's checkpoint in `fray.job_dir()`. An allocation the scheduler ends without requeueing it (here `scancel` by
hand) is not recovered: its job ends FAILED, its attempt `lost`, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _lost_host_driver import marked_line
from _netns import Host, namespaced_hosts, require_namespaced_hosts

from fray.host import procfs

HERE = Path(__file__).parent
DRIVER = HERE.parent / "_preempted_job_driver.py"
PY = sys.executable
GONE_WITHIN = 15.0


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[Host]]:
    require_namespaced_hosts()
    with namespaced_hosts(3) as made:
        yield made


def _fray_processes(host: Host) -> list[str]:
    found = [" ".join(procfs.cmdline(pid) or []) for pid in host.pids()]
    return [c for c in found if "fray" in c or "monarch" in c]


def _wait(ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _run(hosts: list[Host], tmp_path: Path, requeue: bool) -> tuple[dict[str, Any], str]:
    """Run the driver in host 0 on a Slurm allocation of hosts 1 and 2; once the job's first attempt saved its
    checkpoint, have Slurm preempt the allocation (requeue) or cancel it (not requeued). What the driver saw of
    the job's end, and the allocation's job id. The driver's shutdown then cancels the allocation, and nothing of
    fray is left on any host."""
    from _slurm import URGENT, require_slurm, start_slurm

    require_slurm()
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "FRAY_STATE_DIR": str(tmp_path / "state"), "FRAY_TLS_DIR": str(tmp_path / "tls")}
    with start_slurm(hosts[1:], tmp_path / "slurm", controller=hosts[0], preemption=True) as slurm:
        spec = f"monarch?job=slurm&nodes=2&partition={slurm.partition}&time=00:10:00&procs=1&preempt_wait=120"
        log = tmp_path / "driver.log"
        with open(log, "w") as errors:
            driver = hosts[0].popen(
                [PY, str(DRIVER), spec],
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                cwd=work,
                env={**env, **slurm.env()},
            )
        assert driver.stdout is not None
        try:
            before = marked_line(driver.stdout, "BEFORE")
            assert before is not None, log.read_text(errors="replace")[-4000:]
            assert "saved" in before["logs"], before
            (job_id,) = slurm.run(["squeue", "-h", "-p", slurm.partition, "-o", "%i"]).stdout.split()
            if requeue:  # the preemption: a job of the higher tier that needs both nodes whole
                slurm.run(["sbatch", f"--partition={URGENT}", "--nodes=2", "--exclusive", "--wrap", "sleep 1"])

                def requeued() -> bool:
                    state = json.loads(slurm.run(["squeue", "--job", job_id, "--json"]).stdout)["jobs"]
                    mine = next(j for j in state if str(j["job_id"]) == job_id)
                    return int(mine.get("restart_cnt") or 0) >= 1 and mine["job_state"] == "PENDING"

                _wait(requeued, 30, f"Slurm did not requeue job {job_id}: {slurm.log_tails()}")
                # Slurm holds a requeued batch job for about two minutes (its begin time) before it may run again:
                # the test lets it go at once, as waiting would only make the test slower.
                slurm.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
            else:
                slurm.run(["scancel", job_id])
            after = marked_line(driver.stdout, "AFTER")
            assert after is not None, log.read_text(errors="replace")[-4000:]
            driver.wait(timeout=60)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()

        def cancelled() -> bool:
            return slurm.run(["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"]).stdout.split() == ["CANCELLED"]

        _wait(cancelled, GONE_WITHIN, "the allocation was not cancelled")
        _wait(lambda: not any(_fray_processes(h) for h in hosts), GONE_WITHIN, "fray processes were left")
        assert not list((tmp_path / "state").glob("monarch/slurm-jobs/*")), "the jobs' shared directory was left"
    return after, job_id


def test_a_preempted_allocations_job_is_lost_then_runs_again_on_the_requeued_hosts(
    hosts: list[Host], tmp_path: Path
) -> None:
    after, job_id = _run(hosts, tmp_path, requeue=True)
    attempts = after["attempts"]
    assert after["status"] == "SUCCEEDED", after
    assert [(a["outcome"], a["status"]) for a in attempts] == [("lost", "FAILED"), ("succeeded", "SUCCEEDED")]
    assert attempts[0]["message"].startswith(
        f"lost: the Slurm job {job_id} of its hosts was preempted and requeued by Slurm"
    ), attempts[0]
    logs = after["logs"]
    assert "attempt 1 resuming False checkpoint None" in logs, logs
    assert "[fray] attempt 2 (the last was lost: " in logs and "recovery 1 of 3)" in logs, logs
    assert "attempt 2 resuming True checkpoint 100" in logs, logs  # fray.job_dir() outlived the hosts


def test_an_allocation_ended_without_a_requeue_ends_its_job_failed_saying_why(
    hosts: list[Host], tmp_path: Path
) -> None:
    after, job_id = _run(hosts, tmp_path, requeue=False)
    why = f"lost: the Slurm job {job_id} of its hosts ended CANCELLED (not requeued); its jobs are not run again"
    assert after["status"] == "FAILED" and after["message"] == why, after
    assert [(a["outcome"], a["message"]) for a in after["attempts"]] == [("lost", why)], after
    assert f"[fray] the job ends: {why}" in after["logs"], after["logs"]
    assert after["listed"] == ["preempted.1"], after  # its record is still there to read
