"""Reapers of detached jobs' runners: each runner is this process's child until it ends, so it is reaped here if
it ends while this process lives, or it stays a zombie. A reaper polls its runner rather than block in waitpid,
so that its owner's close() stops and joins it; the runners go on (they are detached)."""

from __future__ import annotations

import subprocess
import threading

__all__ = ["Reapers"]

_POLL = 0.5  # seconds between a reaper's looks at its runner
_JOIN_S = 2.0
# Runners still running when their owner closed: reaped at the next add here, so that one that ended meanwhile is
# not a zombie for the rest of this process.
_unreaped: list[subprocess.Popen[bytes]] = []
_lock = threading.Lock()


class Reapers:
    def __init__(self) -> None:
        self._closed = threading.Event()
        self._reapers: list[tuple[threading.Thread, subprocess.Popen[bytes]]] = []  # under _lock

    def add(self, runner: subprocess.Popen[bytes], name: str) -> None:
        """Reap `runner` when it ends, on a thread named `name`."""
        thread = threading.Thread(target=self._wait_for, args=(runner,), name=name, daemon=True)
        with _lock:
            _unreaped[:] = [r for r in _unreaped if r.poll() is None]
            self._reapers = [(t, r) for t, r in self._reapers if t.is_alive()] + [(thread, runner)]
        thread.start()

    def _wait_for(self, runner: subprocess.Popen[bytes]) -> None:
        while runner.poll() is None and not self._closed.wait(_POLL):
            pass

    def close(self) -> None:
        """Stop and join every reaper; a runner still running is left to a later add in this process."""
        self._closed.set()
        with _lock:
            reapers, self._reapers = self._reapers, []
        for thread, runner in reapers:
            thread.join(_JOIN_S)
            if runner.poll() is None:
                with _lock:
                    _unreaped.append(runner)
