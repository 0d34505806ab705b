"""Whatever fray-ray starts dies with its owner, however the owner ends: a driver in a subprocess using
`fray.init("ray")` (a private local Ray, with an actor and a task run) or `fray.cluster("ray")` (a private head
node running a job) is ended by a normal exit without shutdown(), SIGINT, SIGTERM or SIGKILL; within 10 s after
the watchdog's grace no process that the driver's Ray had started (nor the job's) is alive and its temp dir is
gone."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fray.host import procfs

pytest.importorskip("fray_ray")

from fray.host import watchdog

INIT_DRIVER = textwrap.dedent(
    """
    import os, sys, time, fray
    from fray_ray import _connect
    how = sys.argv[1]
    ctx = fray.init("ray?num_cpus=1&object_store_memory=80000000&log_to_driver=false")

    class Pid:
        def pid(self):
            return os.getpid()

    actor = ctx.create_actor(Pid)
    ctx.get([actor.pid(), ctx.create_task(os.getpid)], timeout=120)
    print("READY", _connect._conn.temp_dir, flush=True)
    if how == "exit":
        sys.exit(0)
    time.sleep(600)
    """
)

CLUSTER_DRIVER = textwrap.dedent(
    """
    import os, sys, time, fray
    how = sys.argv[1]
    cluster = fray.cluster("ray?num_cpus=1&object_store_memory=80000000")
    marker = sys.argv[2]
    job = cluster.create_job(f"sleep {marker} & sleep {marker}; wait")
    deadline = time.time() + 90
    while cluster.get_job(job).status != "RUNNING":
        assert time.time() < deadline, cluster.get_job(job)
        time.sleep(0.05)
    print("READY", cluster._head.temp_dir, flush=True)
    if how == "exit":
        sys.exit(0)
    time.sleep(600)
    """
)


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, start time) of every process."""
    table = {}
    for pid in procfs.pids():
        found = procfs.stat(pid)
        if found is not None:
            table[found.pid] = (found.ppid, found.state, str(found.start))
    return table


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live descendant of root (a pid is only "the same process" with its start time)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and table[child][1] not in ("Z", "X"):
                found[child] = table[child][2]
                todo.append(child)
    return found


def _still_alive(procs: dict[int, str]) -> dict[int, str]:
    table = _proc_table()
    return {
        pid: _cmdline(pid)
        for pid, started in procs.items()
        if pid in table and table[pid][2] == started and table[pid][1] not in ("Z", "X")
    }


def _cmdline(pid: int) -> str:
    argv = procfs.cmdline(pid)
    return "?" if argv is None else " ".join(argv)[:80]


def _sleepers(marker: str) -> int:
    return sum(1 for pid in _proc_table() if _cmdline(pid).split()[:2] == ["sleep", marker])


def _end_driver(driver: str, how: str, wait_for_job: str | None = None) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", driver, how, wait_for_job or ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a SIGINT here reaches the driver only
    )
    procs: dict[int, str] = {}
    temp_dir = ""
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read()[-3000:])
        temp_dir = line.split()[1]
        assert os.path.isdir(temp_dir)
        if wait_for_job:
            deadline = time.monotonic() + 30
            while _sleepers(wait_for_job) < 2:  # the job's shell has started both sleeps
                assert time.monotonic() < deadline, "the job should be running"
                time.sleep(0.05)
        procs = _descendants(proc.pid)
        assert len(procs) >= 6, procs  # Ray's processes (and the watchdog) are running
        if how != "exit":
            proc.send_signal(getattr(signal, how))
        proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    deadline = time.monotonic() + watchdog.GRACE + 10
    while _still_alive(procs) or os.path.exists(temp_dir):
        if time.monotonic() > deadline:
            left = _still_alive(procs)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            exists = os.path.exists(temp_dir)
            pytest.fail(f"left behind after {how}: processes {left}, temp dir {temp_dir} exists: {exists}")
        time.sleep(0.2)


@pytest.mark.parametrize("how", ["exit", "SIGINT", "SIGTERM", "SIGKILL"])
def test_private_ray_dies_with_its_owner(how: str) -> None:
    _end_driver(INIT_DRIVER, how)


@pytest.mark.parametrize("how", ["exit", "SIGTERM", "SIGKILL"])
def test_private_head_and_its_job_die_with_their_owner(how: str) -> None:
    marker = f"{307 + random.random():.6f}"  # only this test's job sleeps this long
    _end_driver(CLUSTER_DRIVER, how, wait_for_job=marker)
