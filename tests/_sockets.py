"""Socket checks the tests share, and the environment of a process started without fray's socket guard."""

from __future__ import annotations

import os
import socket

# What starts a process under the guard: preloaded, or restarted into it by fray_monarch_autoguard (a
# FRAY_BACKEND naming monarch); a process meant to run without it is started without any of them.
_GUARD_VARS = ("LD_PRELOAD", "FRAY_BACKEND", "FRAY_SOCKET_GUARD_RESTARTED")


def unguarded_env() -> dict[str, str]:
    """This process's environment for a child that must start without the socket guard."""
    return {k: v for k, v in os.environ.items() if k not in _GUARD_VARS}


def closed_within(conn: socket.socket, within: float) -> bool:
    """The other side closed `conn` within `within` seconds."""
    conn.settimeout(within)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
