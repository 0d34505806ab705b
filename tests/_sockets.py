"""Socket checks the tests share, and the environment of a process started without fray's socket guard."""

from __future__ import annotations

import os
import socket

# What starts a process under the guard: preloaded, or restarted into it by fray_monarch_autoguard (a
# FRAY_BACKEND naming monarch); a process meant to run without it is started without any of them.
_GUARD_VARS = ("LD_PRELOAD", "FRAY_BACKEND", "FRAY_SOCKET_GUARD_RESTARTED")


# `python -m fray_monarch.socket_guard` with the per-user build in HOME (the one installed with fray-monarch lives
# in the package's own directory, not in HOME): what the guard's HOME tests run
PER_USER_GUARD = (
    "-c",
    "import sys; from fray_monarch import socket_guard as g; g._installed = lambda digest: None; "
    "sys.exit(g.main(sys.argv[1:]))",
)


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
