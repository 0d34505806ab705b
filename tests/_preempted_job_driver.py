"""Driver for tests/monarch/test_slurm_preemption.py, run inside namespaced host 0 with the test Slurm's client
environment: a monarch cluster on a Slurm allocation (`job=slurm`), and one named supervised job on it
(`max_retries=0`: a preemption counted as a failure would end it). Its first attempt writes a checkpoint in
`fray.job_dir()` and sleeps, going on after SIGTERM within its 30 s grace, so the preemption's end of its job runner
ends it and its supervisor (the runner's watchdog, 3 s after its SIGTERM) before the supervisor records anything:
the driver's cluster records that attempt. Once the rank said it saved, the driver prints `BEFORE <json>`, then
waits for the job's end (the test preempts the allocation meanwhile) and prints `AFTER <json>`: its status,
attempts and log.

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
    "    signal.signal(signal.SIGTERM, lambda *_: print('got SIGTERM', flush=True))  # (a checkpoint would go here)\n"
    "    saved.write_text('100')\n"
    "    print('saved', flush=True)\n"
    "    time.sleep(300)  # until its allocation is preempted\n"
)
STARTED_WAIT = 120.0
END_WAIT = 180.0


def main() -> None:
    cluster = fray.cluster(sys.argv[1])
    try:
        job = cluster.create_job(
            [sys.executable, "-c", RANK], name="preempted", max_retries=0, max_recoveries=3, stop_grace=30
        )
        deadline = time.monotonic() + STARTED_WAIT
        while "saved" not in job.logs() and time.monotonic() < deadline and not job.status().is_terminal:
            time.sleep(0.2)
        print("BEFORE " + json.dumps({"status": job.status().value, "logs": job.logs(tail=20)}), flush=True)
        start = time.monotonic()
        info = job.wait(timeout=END_WAIT, raise_on_failure=False)
        after: dict[str, Any] = {
            "seconds": round(time.monotonic() - start, 1),
            "status": info.status.value,
            "message": info.message,
            "attempts": [{**dataclasses.asdict(a), "status": a.status.value} for a in info.attempts],
            "logs": job.logs(tail=40),
            "listed": [i.id for i in cluster.list_jobs()],
        }
        print("AFTER " + json.dumps(after), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
