"""fray.testing.workloads.kill_descendant: the conformance suite's way to kill an actor's process. It signals only a
process proven to descend from the test's own, and returns once that process has ended: the suite's restart cases
count "just after the death" from there, and a machine under load takes a while to end a process after SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fray.testing.workloads import kill_descendant


def _ended(pid: int) -> bool:
    """Whether the child `pid` has ended (without reaping it: its exit stays for Popen to read)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def test_a_killed_descendant_has_ended_when_the_kill_returns() -> None:
    for _ in range(20):  # (without the wait, a kill returned before its process had ended in most rounds)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            kill_descendant(child.pid)
            assert _ended(child.pid)
        finally:
            child.kill()
            child.wait()
        assert child.returncode == -9


def test_a_process_that_is_not_a_descendant_is_not_signalled() -> None:
    with pytest.raises(ValueError, match="not a descendant"):
        kill_descendant(os.getppid())
