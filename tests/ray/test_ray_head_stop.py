"""Stopping a Ray head never waits without bound: `ray start --block` that does not end on SIGTERM is SIGKILLed
(fray_ray._head.end_child). Seen in CI on a loaded machine: a head's stop waited 300 s for `ray start`."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fray_ray import _head

SLEEPS = "import time\nprint('ready', flush=True)\ntime.sleep(600)"
IGNORES_SIGTERM = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SLEEPS


def test_a_child_that_ignores_sigterm_is_killed_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_head, "STOP_WAIT", 1.0)
    child = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        start = time.monotonic()
        _head.end_child(child, "a stand-in for ray start")
        assert child.returncode == -9 and time.monotonic() - start < 1.0 + _head.KILL_WAIT
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_child_that_ends_on_sigterm_is_not_killed() -> None:
    child = subprocess.Popen([sys.executable, "-c", SLEEPS], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    _head.end_child(child, "a stand-in for ray start")
    assert child.returncode == -15
