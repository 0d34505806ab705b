"""Starts a monarch driver under fray's socket guard by itself: `FRAY_BACKEND=monarch python app.py` works as
`FRAY_BACKEND=ray python app.py` does, with no wrapper to remember.

fray-monarch installs `fray_monarch_autoguard.pth` beside itself in site-packages, so Python runs `start()` as it
starts, before any of the program's code. A process whose FRAY_BACKEND names monarch (and does not opt out with
unguarded_sockets=true) and that has no guard preloaded yet is executed again, at once, as the same command under
the guard (fray_monarch.socket_guard.guarded_environ). Every other process pays one look at its environment.

This module imports nothing of fray's until it has to: it runs in every Python process of the environment.
"""

from __future__ import annotations

import os
import sys

GUARD_NAMES = ("_socket_guard.", "socket-guard-")  # the installed library's name, and a per-user build's
RESTARTED = "FRAY_SOCKET_GUARD_RESTARTED"  # (socket_guard.RESTARTED: set in the process started again)


def wanted(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether a process with this environment is a monarch driver to start under the guard."""
    spec = environ.get("FRAY_BACKEND", "")
    name, _, options = spec.partition("?")
    if name.strip() != "monarch" or environ.get(RESTARTED):
        return False
    if "unguarded_sockets=true" in options.replace(" ", "").lower():
        return False
    preloaded = environ.get("LD_PRELOAD", "").replace(":", " ").split()
    return not any(os.path.basename(p).startswith(GUARD_NAMES) for p in preloaded)  # (its trust: checked at use)


def start() -> None:
    if not wanted(os.environ) or not getattr(sys, "orig_argv", None):
        return
    try:
        from fray_monarch.socket_guard import restart_under_guard

        restart_under_guard([sys.executable, *sys.orig_argv[1:]])
    except Exception as exc:  # (never breaks Python's start: the monarch context refuses later, naming the ways)
        print(f"fray: could not start this monarch driver under the socket guard: {exc}", file=sys.stderr)
