"""Hosts launched through Monarch's job API on this machine (job=process, and a Monarch job object passed from
Python): a context ends what it launched, at shutdown and when its process is killed, and leaves alone a job the
caller had running already. (The same over ssh and Slurm, on separate network stacks: test_multihost.py.)"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from fray.host import procfs

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import fray
    from fray.host.procfs import alive  # (a zombie is dead)
    from monarch.job import ProcessJob

    how = sys.argv[1]
    if how == "spec":
        ctx = fray.init("monarch?job=process&hosts=2&procs=1")
    else:
        job = ProcessJob({"hosts": 2})
        if how == "running":
            job.apply()  # the caller's: fray must not end it
        ctx = fray.init("monarch?procs=1", job=job)
    workers = sorted(set(ctx.get([ctx.create_task(os.getppid) for _ in range(8)], timeout=120)))
    print(json.dumps({"workers": workers, "nodes": len(ctx.node_resources())}), flush=True)
    if sys.argv[2] == "kill":
        time.sleep(600)
    fray.shutdown()

    print(json.dumps({"after": [alive(w) for w in workers]}), flush=True)
    if how == "running":
        job.kill()
    """
)


def _job_dirs() -> set[str]:
    """Monarch's ProcessJob makes its socket directory with tempfile.mkdtemp(prefix="monarch_process_job_")."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "monarch_process_job_*")))


@pytest.mark.parametrize("how", ["spec", "object", "running"])
def test_a_context_ends_the_hosts_it_launched_at_shutdown(how: str) -> None:
    before = _job_dirs()
    out = subprocess.run([sys.executable, "-c", SCRIPT, how, "shutdown"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = (json.loads(line) for line in out.stdout.splitlines()[-2:])
    assert first["nodes"] == 2 and len(first["workers"]) == 2  # tasks ran under both host workers
    assert second["after"] == ([True, True] if how == "running" else [False, False])
    assert _job_dirs() <= before, "a process job's socket directory was left behind"


def test_hosts_a_killed_driver_launched_end_with_it() -> None:
    before = _job_dirs()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "spec", "kill"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        workers = json.loads(proc.stdout.readline())["workers"]
        assert all(procfs.alive(w) for w in workers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while any(procfs.alive(w) for w in workers):  # the watchdog ends the host workers, their processes with them
            assert time.monotonic() < deadline, [w for w in workers if procfs.alive(w)]
            time.sleep(0.2)
        while not _job_dirs() <= before:  # and removes the job's socket directory
            assert time.monotonic() < deadline, _job_dirs() - before
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
