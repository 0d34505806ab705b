"""Driver for the lost-host plain-command test (tests/monarch/test_lost_host.py), run inside namespaced host 0: two
plain commands (`hostname; sleep 300`, unsupervised) on a cluster of hosts 1 and 2, one per host. The driver prints
`BEFORE <json>` (each job's host), reads the name of the host the test lost from stdin, waits for that host's job to
end, then starts one more plain command and prints `AFTER <json>`: the lost job's status and message, the other
job's status, and the new job's status and host.

    python _lost_host_plain_driver.py SPEC
"""

from __future__ import annotations

import json
import sys
import time

import fray

STARTED_WAIT = 120.0
END_WAIT = 60.0


def main() -> None:
    cluster = fray.cluster(sys.argv[1])
    try:
        jobs = [cluster.create_job("hostname; sleep 300") for _ in range(2)]
        deadline = time.monotonic() + STARTED_WAIT
        while not all(job.logs().strip() for job in jobs) and time.monotonic() < deadline:
            time.sleep(0.2)
        where = {job.logs().strip(): job for job in jobs}
        print("BEFORE " + json.dumps(sorted(where)), flush=True)
        lost = sys.stdin.readline().strip()
        info = where[lost].wait(timeout=END_WAIT, raise_on_failure=False)
        other = next(job for host, job in where.items() if host != lost)
        new = cluster.create_job("hostname")
        ended = new.wait(timeout=END_WAIT, raise_on_failure=False)
        after = {
            "status": info.status.value,
            "message": info.message,
            "other": other.status().value,
            "new": [ended.status.value, new.logs().strip()],
        }
        print("AFTER " + json.dumps(after), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
