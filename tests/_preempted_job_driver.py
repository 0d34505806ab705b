"""Driver for tests/monarch/test_slurm_preemption.py, run inside namespaced host 0 with the test Slurm's client
environment: a monarch cluster on a Slurm allocation (`job=slurm`), and two named supervised jobs on it
(`max_retries=0`: a preemption counted as a failure would end them). The first attempt of each writes a checkpoint
in its `fray.job_dir()` and sleeps. Job "trap" goes on after SIGTERM within its 30 s grace, so the preemption's end
of its job runner ends it and its supervisor (the runner's watchdog, 3 s after) before the supervisor records
anything: the driver's cluster records that attempt. Job "plain" ends at SIGTERM: its supervisor records the
attempt lost, sees its job runner ended with it, and starts no other there. Once both ranks said they saved, the
driver prints `BEFORE <json>`, then waits for the jobs' ends (the test preempts or cancels the allocation
meanwhile) and prints `AFTER <json>`: each job's status, attempts and log.

    python _preempted_job_driver.py SPEC
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

import fray

RANK = (
    "import os, signal, time, fray\n"
    "attempt = os.environ['FRAY_JOB_ATTEMPT']\n"
    "saved = fray.job_dir() / 'step'\n"
    "print('attempt', attempt, 'resuming', fray.resuming(), 'checkpoint', saved.read_text() if saved.exists() "
    "else None, flush=True)\n"
    "if attempt == '1':\n"
    "    if os.environ['TRAP'] == '1':  # (a checkpoint would be written here)\n"
    "        signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM', flush=True))\n"
    "    saved.write_text('100')\n"
    "    print('saved', flush=True)\n"
    "    time.sleep(300)  # until its allocation is preempted\n"
)
STARTED_WAIT = 120.0
END_WAIT = 180.0


def _ended(cluster: Any, job: Any) -> dict[str, Any]:
    info = job.wait(timeout=END_WAIT, raise_on_failure=False)
    return {
        "status": info.status.value,
        "message": info.message,
        "attempts": [{**dataclasses.asdict(a), "status": a.status.value} for a in info.attempts],
        "logs": job.logs(tail=40),
    }


def main() -> None:
    cluster = fray.cluster(sys.argv[1])
    try:
        jobs = {
            trap: cluster.create_job(
                [sys.executable, "-c", RANK],
                name=trap,
                max_retries=0,
                max_recoveries=3,
                stop_grace=30,
                env=fray.RuntimeEnv(env={"TRAP": "1" if trap == "trap" else "0"}),
            )
            for trap in ("trap", "plain")
        }
        deadline = time.monotonic() + STARTED_WAIT
        while time.monotonic() < deadline and not all("saved" in job.logs() for job in jobs.values()):
            if any(job.status().is_terminal for job in jobs.values()):
                break
            time.sleep(0.2)
        print("BEFORE " + json.dumps({name: job.logs(tail=20) for name, job in jobs.items()}), flush=True)
        after: dict[str, Any] = {name: _ended(cluster, job) for name, job in jobs.items()}
        after["listed"] = sorted(i.id for i in cluster.list_jobs())
        print("AFTER " + json.dumps(after), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
