"""The watchdog: cleans what its owner left when the owner dies, and is gone once nothing is left to watch."""

from __future__ import annotations

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
