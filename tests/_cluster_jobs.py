"""A cluster with the jobs its live page must show (tests/dashboard): one that succeeded, one that failed with exit
code 3, and one that runs (its driver announced its own live page: FRAY_DASHBOARD=1, as `fray job submit
--dashboard` sets) until the test stops it."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fray import RuntimeEnv
from fray.dashboard import ANNOUNCED
from fray.in_memory.cluster import InMemoryClusterContext

# a job's driver: its live page starts at fray.init() (FRAY_DASHBOARD=1); it runs until stopped (or 120 s)
DRIVER = """
import time, fray
ctx = fray.init("in_memory")
print(sum(ctx.get([ctx.create_task(abs, args=(-i,)) for i in range(10)])), flush=True)
time.sleep(120)
"""


@dataclass(frozen=True)
class Jobs:
    succeeded: str
    failed: str
    running: str  # named "trainer": its id is trainer.1
    running_url: str  # the live page its driver announced


def submit_jobs(cluster: InMemoryClusterContext, where: Path) -> Jobs:
    """Submits the three jobs and returns once the first two have ended and the third has announced its page."""
    driver = where / "driver.py"
    driver.write_text(DRIVER)
    ok = cluster.create_job([sys.executable, "-c", "print('all good')"], working_dir=where)
    bad = cluster.create_job([sys.executable, "-c", "import sys; sys.exit(3)"], working_dir=where)
    assert cluster.wait_job(ok, timeout=60).status == "SUCCEEDED"
    assert cluster.wait_job(bad, timeout=60).exit_code == 3
    env = RuntimeEnv(env={"FRAY_DASHBOARD": "1"})
    running = cluster.create_job([sys.executable, str(driver)], env=env, working_dir=where, name="trainer")
    deadline = time.monotonic() + 60
    while True:
        found = ANNOUNCED.search(cluster.get_job_logs(running))
        if found is not None:
            return Jobs(str(ok), str(bad), str(running), found.group("url"))
        assert time.monotonic() < deadline, cluster.get_job_logs(running)
        assert cluster.get_job(running).status == "RUNNING", cluster.get_job_logs(running)
        time.sleep(0.1)
