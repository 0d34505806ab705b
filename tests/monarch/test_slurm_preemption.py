"""A monarch cluster on a Slurm allocation (`job=slurm`) whose allocation Slurm preempts, on the test Slurm of the
multi-host tests (slurmctld in namespaced host 0, a slurmd in each of hosts 1 and 2), configured for preemption as
a site with preemptible capacity is: PreemptType=preempt/partition_prio, PreemptMode=REQUEUE, and a partition of the
same nodes with a higher priority tier. A whole-node job submitted there takes both nodes: Slurm signals every
process of the cluster's allocation (its host workers, the job runners, the jobs' supervisors and ranks) and
requeues it. The driver's cluster waits for the allocation's next run, records each job's running attempt `lost`
naming the preemption (not counted against max_retries=0), and runs its next attempt there, which finds the first
attempt's checkpoint in `fray.job_dir()`: for a rank that goes on after SIGTERM (its supervisor is killed before
it records anything) and for one that ends at SIGTERM (its supervisor records the attempt lost itself). An
allocation the scheduler ends without requeueing it (here `scancel` by hand) is not recovered: its jobs end
FAILED, their attempt `lost`, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _lost_host_driver import marked_line
from _netns import Host

from fray.host import procfs

HERE = Path(__file__).parent
DRIVER = HERE.parent / "_preempted_job_driver.py"
PY = sys.executable
GONE_WITHIN = 15.0


def _fray_processes(host: Host) -> list[str]:
    found = [" ".join(procfs.cmdline(pid) or []) for pid in host.pids()]
    return [c for c in found if "fray" in c or "monarch" in c]


def _wait(ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _run(hosts: list[Host], tmp_path: Path, requeue: bool) -> tuple[dict[str, Any], str]:
    """Run the driver in host 0 on a Slurm allocation of hosts 1 and 2; once its jobs' first attempts saved their
    checkpoints, have Slurm preempt the allocation (requeue) or cancel it (not requeued). What the driver saw of
    the jobs' ends, and the allocation's job id. The driver's shutdown then cancels the allocation, and nothing of
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
            assert all("saved" in logs for logs in before.values()), before
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


def test_a_preempted_allocations_jobs_are_lost_then_run_again_on_the_requeued_hosts(
    hosts: list[Host], tmp_path: Path
) -> None:
    after, job_id = _run(hosts, tmp_path, requeue=True)
    preempted = f"lost: the Slurm job {job_id} of its hosts was preempted and requeued by Slurm"
    for name in ("trap", "plain"):
        job = after[name]
        attempts, logs = job["attempts"], job["logs"]
        assert job["status"] == "SUCCEEDED", job
        assert [(a["outcome"], a["status"]) for a in attempts] == [("lost", "FAILED"), ("succeeded", "SUCCEEDED")]
        assert "attempt 1 resuming False checkpoint None" in logs, logs
        assert logs.count("[fray] attempt 2 (the last was lost: ") == 1 and "recovery 1 of 3)" in logs, logs
        assert "attempt 2 resuming True checkpoint 100" in logs, logs  # fray.job_dir() outlived the hosts
    # trap: its supervisor was killed before it recorded anything; the driver's cluster records the attempt
    assert after["trap"]["attempts"][0]["message"] == preempted, after["trap"]
    # plain: its supervisor recorded the attempt lost to the SIGTERM and started no other on the preempted host
    assert after["plain"]["attempts"][0]["message"].startswith(f"{preempted} (its supervisor saw: preempted: ")
    assert "no further attempt here" in after["plain"]["logs"], after["plain"]["logs"]


def test_an_allocation_ended_without_a_requeue_ends_its_jobs_failed_saying_why(
    hosts: list[Host], tmp_path: Path
) -> None:
    after, job_id = _run(hosts, tmp_path, requeue=False)
    why = f"lost: the Slurm job {job_id} of its hosts ended CANCELLED (not requeued); its jobs are not run again"
    job = after["trap"]
    assert job["status"] == "FAILED" and job["message"] == why, job
    assert [(a["outcome"], a["message"]) for a in job["attempts"]] == [("lost", why)], job
    assert f"[fray] the job ends: {why}" in job["logs"], job["logs"]
    assert after["plain"]["status"] == "FAILED" and [a["outcome"] for a in after["plain"]["attempts"]] == ["lost"]
    assert after["listed"] == ["plain.1", "trap.1"], after  # their records are still there to read
