"""fray.host.procfs reads /proc right: a process name with spaces and parentheses does not shift the fields, a zombie
counts as gone, and argv comes back as the process was given it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fray.host import procfs


def test_fields_after_a_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    # The kernel's name of a process is its executable's name: a copy named like this shows it in /proc/PID/stat.
    odd = tmp_path / "a) b (c"
    shutil.copy("/bin/sleep", odd)
    proc = subprocess.Popen([str(odd), "30"])
    try:
        deadline = time.monotonic() + 10
        while procfs.cmdline(proc.pid) != [str(odd), "30"]:  # (the forked child has not exec'd the copy yet)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        found = procfs.stat(proc.pid)
        assert found is not None
        assert found.ppid == os.getpid()
        assert found.pgid == os.getpgid(proc.pid)
        assert procfs.state(proc.pid) in ("R", "S")
        assert proc.pid in procfs.pids()
        assert not procfs.gone(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_is_gone_and_an_ended_process_has_no_state() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while procfs.state(proc.pid) != "Z":  # ended, not reaped yet
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert procfs.gone(proc.pid)
    assert procfs.cmdline(proc.pid) == []  # (a zombie's argv is gone with its memory)
    proc.wait()
    assert procfs.state(proc.pid) is None
    assert procfs.cmdline(proc.pid) is None
    assert procfs.gone(proc.pid)


def test_stop_groups_ends_several_groups_within_one_grace() -> None:
    # One group ends on SIGTERM; the other ignores it and is SIGKILLed: both within one grace, not two.
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    stubborn = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    polite = subprocess.Popen(["sleep", "60"], start_new_session=True)
    assert stubborn.stdout is not None and stubborn.stdout.readline()  # its SIGTERM handler is set
    leaders = [procfs.Identity.of(p.pid) for p in (stubborn, polite)]
    assert None not in leaders
    started = time.monotonic()
    assert procfs.stop_groups([leader for leader in leaders if leader is not None], grace=2.0)
    assert time.monotonic() - started < 3.5  # (two graces would be 4 s)
    assert stubborn.wait(5) == -9 and polite.wait(5) == -15
