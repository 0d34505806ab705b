"""`fray status` on a Ray cluster by address shows its nodes, its running tasks and live actors, and its jobs
(seen from another process, through Ray's dashboard)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fray
from fray.testing import group_workloads as g
from fray.testing import workloads as h

# The workers of a cluster joined by address import what they run by module (this test module is not on their
# path): use the suite's installed helpers.


def test_status_shows_running_tasks_and_live_actors(tmp_path: Path) -> None:
    flag = str(tmp_path / "flag")
    with fray.cluster("ray") as jobs:
        ctx = fray.init(f"ray?address={jobs.gcs_address}")
        try:
            keeper = ctx.create_actor(h.Counter)
            assert ctx.get(keeper.incr(), timeout=120) == 1
            running = ctx.create_task(g.wait_then, args=(flag, 1, 600))  # outlives the polling and status below
            # Ray's dashboard reports nodes, tasks and actors a few seconds after they exist (its state API and
            # cluster status lag behind, more so on a loaded machine): both views are polled, with room to spare.
            deadline = time.monotonic() + 180
            while True:
                work = jobs.running_work()
                assert work is not None
                if any(t["name"] == "wait_then" for t in work["tasks"]) and any(
                    a["class"] == "Counter" for a in work["actors"]
                ):
                    break
                assert time.monotonic() < deadline, work
                time.sleep(0.5)
            env = {**os.environ, "FRAY_STATE_DIR": str(tmp_path / "state")}
            command = [sys.executable, "-m", "fray.cli", "status", "--backend", "ray", "--address", jobs.address]
            while True:
                out = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=120, env=env)
                assert out.returncode == 0, out.stderr
                seen = json.loads(out.stdout)
                if seen["nodes"] and any(t["name"] == "wait_then" for t in seen["tasks"]):
                    break
                assert time.monotonic() < deadline, seen
                time.sleep(0.5)
            Path(flag).write_text("go")
            assert ctx.get(running, timeout=60) == 1
        finally:
            fray.shutdown()
