"""Which connections a live page's server holds, so that idle connections from anyone who can reach its port
cannot take the driver's file descriptors or threads, nor keep the page's own browser out.

A connection is *unproven* from its accept until its request shows the page's token or session cookie; then it is
*proven* (it is answered and closed: the server speaks HTTP/1.0, one request a connection). At most
MAX_CONNECTIONS are held at once and at most MAX_UNPROVEN_PER_PEER unproven ones of one peer address. A new
connection over either bound takes the place of the oldest unproven one (of that address, else of any), so a
flood of idle connections only ever replaces itself, and a browser that sends its request at once is answered;
when every held connection is proven the new one is closed. An unproven connection is closed PROVE_WITHIN seconds
after its accept, however slowly its bytes come.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

__all__ = ["MAX_CONNECTIONS", "MAX_UNPROVEN_PER_PEER", "PROVE_WITHIN", "Admission"]

MAX_CONNECTIONS = 64  # connections held at once (a thread each)
MAX_UNPROVEN_PER_PEER = 8  # unproven connections of one peer address at once
PROVE_WITHIN = 10.0  # seconds from its accept for a connection to send a request that proves itself


@dataclass
class _Held:
    peer: str
    since: float  # time.monotonic() at its accept
    proven: bool = False


class Admission:
    """The connections a server holds, each admitted at accept, proven by its request, released at its close."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[socket.socket, _Held] = {}  # in the order they were accepted: the oldest first

    def __len__(self) -> int:
        return len(self._held)

    def admit(self, sock: socket.socket, peer: str) -> bool:
        """Counts `sock` in, replacing the oldest unproven connection where a bound says so; False when every
        held connection is proven (then the caller closes `sock`)."""
        with self._lock:
            unproven = [s for s, h in self._held.items() if not h.proven]
            same_peer = [s for s in unproven if self._held[s].peer == peer]
            if len(same_peer) >= MAX_UNPROVEN_PER_PEER:
                self._evict(same_peer[0])
            elif len(self._held) >= MAX_CONNECTIONS:
                if not unproven:
                    return False
                self._evict(unproven[0])
            self._held[sock] = _Held(peer, time.monotonic())
            return True

    def prove(self, sock: socket.socket) -> bool:
        """Marks `sock` proven; False if it was closed meanwhile (its request must not be answered)."""
        with self._lock:
            held = self._held.get(sock)
            if held is None:
                return False
            held.proven = True
            return True

    def release(self, sock: socket.socket) -> None:
        with self._lock:
            self._held.pop(sock, None)

    def close_overdue(self) -> float | None:
        """Closes the unproven connections held PROVE_WITHIN or longer; returns the seconds until the next one is
        due (None: none unproven)."""
        now = time.monotonic()
        with self._lock:
            due: float | None = None
            for sock, held in list(self._held.items()):
                if held.proven:
                    continue
                left = held.since + PROVE_WITHIN - now
                if left <= 0:
                    self._evict(sock)
                elif due is None or left < due:
                    due = left
            return due

    def close_all(self) -> None:
        with self._lock:
            for sock in list(self._held):
                self._evict(sock)

    def _evict(self, sock: socket.socket) -> None:
        """Stops counting `sock` and ends its connection (under the lock): its thread's read sees the end, and
        that thread closes it."""
        del self._held[sock]
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
