"""Driver for the lost-rank job tests (tests/monarch/test_lost_host.py, tests/ray/test_ray_lost_node.py), run inside
namespaced host 0: a job of 2 ranks spread over hosts 1 and 2 (`create_job(..., replicas=2, placement="spread",
max_retries=0)`; PLACEMENT `none`: no placement, where the backend puts them). Each rank of the first attempt
prints where it runs and sleeps; the driver prints `BEFORE <json>` (each rank's host, the names of each node's
resources), waits for a line on stdin (the test loses one rank's host meanwhile), then waits for the job's end
and prints `AFTER <json>`: its status, message and attempts as JobInfo has them, and its log.

    python _lost_rank_job_driver.py SPEC RANK_RESOURCES_JSON [NODES [PLACEMENT]]

NODES: first wait until the cluster's node_status lists that many nodes (a job's feasibility is checked there).
PLACEMENT: create_job's placement (default spread; `none`: None).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

import fray

RANK = (
    "import os, socket, time\n"
    "attempt = os.environ['FRAY_JOB_ATTEMPT']\n"
    "print('rank', os.environ['RANK'], 'on', socket.gethostname(), 'attempt', attempt, 'of', "
    "os.environ['WORLD_SIZE'], flush=True)\n"
    "if attempt == '1':\n"
    "    time.sleep(300)  # until its host is lost (the other rank: until the supervisor ends the attempt)\n"
)
STARTED_WAIT = 150.0
END_WAIT = 240.0


def _ranks(logs: str, attempt: str) -> dict[str, str]:
    """Rank -> host of the ranks of `attempt` that said where they run."""
    found = {}
    for line in logs.splitlines():
        words = line.split()
        if "rank" in words and "attempt" in words:
            at = words.index("rank")
            if words[at + 2 : at + 3] == ["on"] and words[at + 4 : at + 6] == ["attempt", attempt]:
                found[words[at + 1]] = words[at + 3]
    return found


def main() -> None:
    spec, resources = sys.argv[1], json.loads(sys.argv[2])
    nodes = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    placement = sys.argv[4] if len(sys.argv) > 4 else "spread"
    cluster = fray.cluster(spec)
    try:
        deadline = time.monotonic() + STARTED_WAIT
        while len(cluster.node_status()) < nodes and time.monotonic() < deadline:
            time.sleep(0.5)  # (Ray's dashboard lists a node a few seconds after the GCS has it)
        job = cluster.create_job(
            [sys.executable, "-c", RANK],
            name="lost-rank",
            replicas=2,
            placement=None if placement == "none" else placement,
            resources=resources,
            max_retries=0,  # a lost attempt counted as a failure would end the job
        )
        deadline = time.monotonic() + STARTED_WAIT
        while len(ranks := _ranks(job.logs(), "1")) < 2 and time.monotonic() < deadline:
            if job.status().is_terminal:
                break
            time.sleep(0.2)
        names = sorted(sorted(node["total"]) for node in cluster.node_status())  # (the resources' names)
        before: dict[str, Any] = {"ranks": ranks, "status": job.status().value, "nodes": names}
        if job.status().is_terminal:  # (ended before its ranks said where they run: why, for the test's message)
            before["message"] = job.info().message
            before["logs"] = job.logs(tail=40)
        print("BEFORE " + json.dumps(before), flush=True)
        sys.stdin.readline()
        start = time.monotonic()
        info = job.wait(timeout=END_WAIT, raise_on_failure=False)
        after: dict[str, Any] = {
            "seconds": round(time.monotonic() - start, 1),
            "status": info.status.value,
            "message": info.message,
            "attempts": [{**dataclasses.asdict(a), "status": a.status.value} for a in info.attempts],
            "ranks_after": _ranks(job.logs(), "2"),
            "logs": job.logs(tail=60),
        }
        print("AFTER " + json.dumps(after), flush=True)
    finally:
        cluster.shutdown()


def assert_lost_then_succeeded(after: dict[str, Any], lost_message: str, host_left: str, naming: str = "") -> None:
    """What a test checks of AFTER when one host was lost: the job succeeded, its attempt 1 `lost` (its message
    starting with `lost_message` and naming `naming`), attempt 2 with both ranks on `host_left`, and the log's line
    for the recovery (the loss not counted against max_retries=0)."""
    attempts = after["attempts"]
    assert after["status"] == "SUCCEEDED", after
    assert [(a["outcome"], a["status"]) for a in attempts] == [("lost", "FAILED"), ("succeeded", "SUCCEEDED")], after
    assert attempts[0]["message"].startswith(lost_message) and naming in attempts[0]["message"], attempts[0]
    assert [a["world_size"] for a in attempts] == [2, 2]
    assert after["ranks_after"] == {"0": host_left, "1": host_left}, after
    assert "[fray] attempt 2 (the last was lost: " in after["logs"] and "recovery 1 of 10)" in after["logs"], after


if __name__ == "__main__":
    main()
