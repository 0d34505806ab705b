"""Whatever fray starts dies with its owner, however the owner ends: a driver in a subprocess is ended by a
normal exit without shutdown(), an exception, SIGINT, SIGTERM and SIGKILL; then nothing of its is left."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fray

WAYS = ["exit", "exception", "SIGINT", "SIGTERM", "SIGKILL"]

DRIVER = textwrap.dedent(
    """
    import os, sys, time, fray
    how, backend = sys.argv[1], sys.argv[2]
    cluster = fray.cluster(backend)
    marker = sys.argv[3]
    job = cluster.create_job(f"sleep {marker} & sleep {marker}; wait")
    deadline = time.time() + 60
    while cluster.get_job(job).status != "RUNNING":
        assert time.time() < deadline, cluster.get_job(job)
        time.sleep(0.05)
    print("READY", os.getpid(), flush=True)
    if how == "exit":
        sys.exit(0)
    if how == "exception":
        raise RuntimeError("the driver fails")
    time.sleep(600)
    """
)


def _descendants_sleeping(marker: str) -> list[int]:
    """pids of `sleep MARKER` processes (the job's: the marker is unique to one test) still alive anywhere."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if cmd[:2] == [b"sleep", marker.encode()] and stat.split()[2] != "Z":
            found.append(int(entry.name))
    return found


def _fray_job_dirs() -> set[str]:
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    return {p.name for p in tmp.glob("fray-jobs-*")} | {p.name for p in tmp.glob("fray-monarch-jobs-*")}


@pytest.mark.parametrize("how", WAYS)
def test_jobs_die_with_their_in_memory_owner(how: str) -> None:
    _check_owner_death(how, "in_memory")


@pytest.mark.skipif("monarch" not in fray.available_backends(), reason="fray-monarch is not installed")
@pytest.mark.parametrize("how", ["exit", "SIGKILL"])
def test_jobs_die_with_their_monarch_owner(how: str) -> None:
    _check_owner_death(how, "monarch?procs=1")


def _check_owner_death(how: str, backend: str) -> None:
    before_dirs = _fray_job_dirs()
    marker = f"{300 + random.random():.6f}"  # only this test's job sleeps this long
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, how, backend, marker],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.stderr else "")
        deadline = time.monotonic() + 30
        while len(_descendants_sleeping(marker)) < 2:  # the job's shell has started both sleeps
            assert time.monotonic() < deadline, "the job should be running"
            time.sleep(0.05)
        if how in ("SIGINT", "SIGTERM", "SIGKILL"):
            proc.send_signal(getattr(signal, how))
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    deadline = time.monotonic() + 10
    while _descendants_sleeping(marker) or (_fray_job_dirs() - before_dirs):
        if time.monotonic() > deadline:
            left = _descendants_sleeping(marker)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"left behind after {how}: processes {left}, dirs {_fray_job_dirs() - before_dirs}")
        time.sleep(0.2)
