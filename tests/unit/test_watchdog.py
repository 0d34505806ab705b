"""The watchdog: cleans what its owner left when the owner dies, and is gone once nothing is left to watch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fray.host import procfs

OWNER = """
import os, sys, time
from fray.host import procfs
from fray.host import watchdog
keep, drop = sys.argv[1], sys.argv[2]
watchdog.watch_path(keep)
watchdog.watch_path(drop)
watchdog.forget_path(drop)
watchdog.forget_path("/never/watched")  # says nothing
print(*procfs.children_of(os.getpid()), flush=True)
if sys.argv[3] == "forget":
    watchdog.forget_path(keep)
    deadline = time.monotonic() + 30
    while procfs.children_of(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("children left:", len(procfs.children_of(os.getpid())), flush=True)
else:
    time.sleep(600)  # killed by the test
"""


def _wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while procfs.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not procfs.alive(pid)


def _ignores(pid: int, signum: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_the_watchdog_cleans_up_after_an_owner_killed_by_sigkill(tmp_path: Path) -> None:
    keep, drop = tmp_path / "keep", tmp_path / "drop"
    keep.mkdir()
    drop.mkdir()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(keep), str(drop), "kill"], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    watchdog_pids = [int(p) for p in owner.stdout.readline().split()]
    assert len(watchdog_pids) == 1  # one watchdog, however many things it watches
    owner.kill()
    owner.wait(timeout=30)
    assert _wait_gone(watchdog_pids[0])
    assert not keep.exists()  # removed after the owner died
    assert drop.exists()  # forgotten before it died


def test_the_watchdog_exits_once_everything_is_forgotten(tmp_path: Path) -> None:
    keep, drop = tmp_path / "keep", tmp_path / "drop"
    keep.mkdir()
    drop.mkdir()
    out = subprocess.run(
        [sys.executable, "-c", OWNER, str(keep), str(drop), "forget"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    watchdog_pid = int(out.stdout.split()[0])
    assert "children left: 0" in out.stdout
    assert _wait_gone(watchdog_pid)
    assert keep.exists() and drop.exists()  # a watchdog whose list is empty removes nothing


def test_the_watchdog_outlives_a_sigterm_to_every_process_and_ends_the_owners_groups(tmp_path: Path) -> None:
    """A scheduler ending a job (a Slurm preemption) sends SIGTERM to every process of it at once, the watchdog too:
    it still ends the groups its owner gave it (here a child ignoring SIGTERM in a session of its own, as a job's
    supervisor in its grace). Before, the watchdog died of that SIGTERM and the group ran on."""
    code = (
        "import os, signal, subprocess, sys, time\n"
        "from fray.host import procfs, watchdog\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time\\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\ntime.sleep(600)'], start_new_session=True)\n"
        "watchdog.watch_group(child.pid)\n"
        "print(child.pid, *procfs.children_of(os.getpid()), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    child, *others = (int(p) for p in owner.stdout.readline().split())
    (watchdog_pid,) = [p for p in others if p != child]
    try:
        deadline = time.monotonic() + 30
        while not _ignores(watchdog_pid, signal.SIGINT):  # its main() began (it ignores SIGINT first)
            assert time.monotonic() < deadline, "the watchdog never started"
            time.sleep(0.05)
        for pid in (watchdog_pid, owner.pid):  # the watchdog first: it must not depend on hearing it later
            os.kill(pid, signal.SIGTERM)
        owner.wait(timeout=30)
        assert _wait_gone(child), "the watched group outlived its owner"
        assert _wait_gone(watchdog_pid)
    finally:
        for pid in (child, watchdog_pid, owner.pid):
            if procfs.alive(pid):
                os.kill(pid, signal.SIGKILL)
