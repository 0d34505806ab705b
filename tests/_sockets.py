"""Socket checks the data-plane tests share."""

from __future__ import annotations

import socket


def closed_within(conn: socket.socket, within: float) -> bool:
    """The other side closed `conn` within `within` seconds."""
    conn.settimeout(within)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
