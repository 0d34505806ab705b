"""A real two-node Ray cluster on this machine: placement by resources, and a detached actor seen by a second
driver. The cluster and both drivers run in a subprocess (_multinode_driver.py), since Ray allows one connection
per process and this pytest process may hold the conformance suite's. That subprocess stops exactly the cluster
it started; on a timeout this test kills exactly that subprocess's process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fray_ray")

DRIVER = Path(__file__).with_name("_multinode_driver.py")


def test_two_nodes_placement_and_detached_actor_from_second_driver() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"multi-node driver timed out:\n{stderr[-3000:]}")
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"driver failed ({proc.returncode}):\n{stderr[-3000:]}"
    out = json.loads(lines[-1][len("RESULT ") :])
    assert out["nodes"] == 2
    assert out["head"] != out["worker"]
    assert out["task_head"] == out["head"]
    assert out["task_worker"] == out["worker"]
    assert out["actor"] == out["worker"]
    # the second driver found the named detached actor, on the worker node, with the first driver's state
    assert out["second_driver"] == [out["worker"], "2"]
    assert out["infeasible"] == "refused"
