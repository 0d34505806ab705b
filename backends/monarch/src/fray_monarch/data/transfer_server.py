"""The owner's side of the data plane between hosts: a process serves its live allocations over TCP to readers
of other hosts that prove their capability (transfer.py says what travels where).

What a connection may hold: a request must be complete and its capability proved within AUTH_TIMEOUT of its first
byte (of the accept, for a new connection), a deadline however slowly the bytes come. Connections are counted by
what they proved, never by their peer's address (a local user has all of 127/8 and of IPv6's loopback and
link-local addresses to come from): at most MAX_UNPROVEN connections that have proved no capability yet are held,
and a new one beyond that takes the place of the oldest of them, so strangers only ever replace each other. At most
MAX_CONNECTIONS are served at once, and when they are all taken a new connection replaces the oldest one that is
idle (a reader's pooled connection, authenticated, between requests) or still unauthenticated after
HANDSHAKE_GRACE (a reader proves its capability within a round trip). Otherwise it is closed at accept, and the
reader waits and tries again (transfer.fetch): readers beyond the cap are served later, not failed. A failed
accept (no file descriptor left) pauses accepting, 10 ms doubling up to a second.
"""

from __future__ import annotations

import enum
import errno
import hmac
import logging
import secrets
import socket
import ssl
import threading
import time
from dataclasses import dataclass

from fray_monarch.data.arena import Arena
from fray_monarch.data.transfer_wire import (
    CHALLENGE,
    GRANT,
    NAME_MAX,
    NONCE,
    PROOF,
    REQUEST,
    capability,
    part_key,
    proof,
    recv_exact,
    send_tagged,
)

log = logging.getLogger("fray_monarch")

IO_TIMEOUT = 120.0  # sending one part's bytes (sendall's timeout bounds the whole call)
AUTH_TIMEOUT = 10.0  # a request must be complete and proved within this of its first byte (or of the accept)
IDLE_TIMEOUT = 60.0  # an authenticated connection idle this long is closed
MAX_CONNECTIONS = 64  # connections served at once (a thread each)
MAX_UNPROVEN = 32  # connections that proved no capability yet; a new one beyond replaces the oldest of them
ACCEPT_PAUSE_MAX = 1.0  # seconds accepting pauses at most after a failed accept
HANDSHAKE_GRACE = 1.0  # when full, a connection unauthenticated this long gives its place to a new one
# What the bytes carry: a tag each part (transfer_wire.py), or TLS (transfer_tls.py, transport=tls).


class Stage(enum.Enum):
    HANDSHAKE = "handshake"  # reading a request and its proof (may be a stranger)
    SERVING = "serving"  # authenticated, sending bytes
    IDLE = "idle"  # authenticated, waiting for the reader's next request


@dataclass
class Served:
    """One connection of the server and what it is doing (changed under the server's lock)."""

    sock: socket.socket
    peer: str
    stage: Stage
    since: float  # time.monotonic() when it entered its stage
    proven: bool = False  # it has proved a capability (then its later requests count as a reader's)


class TransferServer:
    """Serves this process's live allocations to readers on other hosts that prove their capability: one thread
    per connection, MAX_CONNECTIONS at most (see the module's docstring for which connection gives way)."""

    def __init__(self, arena: Arena, bind_host: str, tls: ssl.SSLContext | None = None) -> None:
        self.arena = arena
        self.tls = tls  # transport=tls: every connection is TLS, its bytes untagged (TLS protects them)
        self.key = secrets.token_bytes(32)  # never leaves this process: capabilities are derived from it
        self.sock = socket.create_server((bind_host, 0), backlog=64)
        self.address = f"{bind_host}:{self.sock.getsockname()[1]}"
        self.lock = threading.Lock()
        self.served: dict[int, Served] = {}  # by id(): those counted against MAX_CONNECTIONS
        self.closed = False
        self.warned = -60.0  # when a refusal was last logged as a warning (at most one a minute: a flood is one)
        threading.Thread(target=self._accept, name="fray-transfer-server", daemon=True).start()

    def capability(self, aid: int, segment: str, offset: int, length: int) -> bytes:
        return capability(self.key, aid, segment, offset, length)

    def _accept(self) -> None:
        pause = 0.0
        while not self.closed:
            try:
                conn, peer = self.sock.accept()
            except OSError as exc:
                if self.closed or exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return
                pause = min(max(pause * 2, 0.01), ACCEPT_PAUSE_MAX)  # out of descriptors: wait, do not spin
                time.sleep(pause)
                continue
            pause = 0.0
            entry = Served(conn, str(peer[0]), Stage.HANDSHAKE, time.monotonic())
            refused = self._admit(entry)
            if refused:
                self._log_refusal(f"connection from {peer[0]} closed at accept: {refused}")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(entry,), name="fray-transfer", daemon=True).start()

    def _log_refusal(self, what: str) -> None:
        now = time.monotonic()
        level = logging.WARNING if now - self.warned >= 60 else logging.DEBUG
        self.warned = now if level == logging.WARNING else self.warned
        log.log(level, "fray: transfer server at %s: %s", self.address, what)

    def _admit(self, entry: Served) -> str:
        """Count `entry` in, making room if it may; why not if not ("": admitted)."""
        with self.lock:
            unproven = [s for s in self.served.values() if not s.proven]
            if len(unproven) >= MAX_UNPROVEN:
                self._evict(min(unproven, key=lambda s: s.since))
            elif len(self.served) >= MAX_CONNECTIONS:
                victim = self._replaceable(entry.since)
                if victim is None:
                    return f"{MAX_CONNECTIONS} connections are being served (the reader tries again)"
                self._evict(victim)
            self.served[id(entry)] = entry
            return ""

    def _replaceable(self, now: float) -> Served | None:
        """The connection a new one may replace: the oldest idle, else the oldest unauthenticated for longer than
        HANDSHAKE_GRACE (called under the lock)."""
        idle = [s for s in self.served.values() if s.stage is Stage.IDLE]
        if idle:
            return min(idle, key=lambda s: s.since)
        stale = [s for s in self.served.values() if not s.proven and now - s.since > HANDSHAKE_GRACE]
        return min(stale, key=lambda s: s.since) if stale else None

    def _evict(self, victim: Served) -> None:
        """Close `victim` (under the lock): its thread's blocked recv returns, and it no longer counts."""
        del self.served[id(victim)]
        try:  # the TCP socket's own shutdown, also under TLS: its recv returns, whatever TLS was doing
            socket.socket.shutdown(victim.sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def _enter(self, entry: Served, stage: Stage) -> bool:
        """Move `entry` to `stage` (SERVING: it has proved a capability); False if it was evicted (then it must
        stop)."""
        with self.lock:
            if id(entry) not in self.served:
                return False
            entry.stage, entry.since = stage, time.monotonic()
            entry.proven = entry.proven or stage is Stage.SERVING
            return True

    def _serve(self, entry: Served) -> None:
        try:
            entry.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            first, deadline = b"", entry.since + AUTH_TIMEOUT
            if self.tls is not None:  # the TLS handshake is part of the request's deadline
                entry.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                wrapped = self.tls.wrap_socket(entry.sock, server_side=True)
                with self.lock:
                    entry.sock = wrapped
            while self._answer(entry, first, deadline) and self._enter(entry, Stage.IDLE):
                entry.sock.settimeout(IDLE_TIMEOUT)
                first = entry.sock.recv(1)  # the next request's first byte: its deadline starts now
                deadline = time.monotonic() + AUTH_TIMEOUT
                if not first or not self._enter(entry, Stage.HANDSHAKE):
                    return
        except Exception as exc:  # malformed, unauthenticated, timed out, evicted, gone: this connection only
            log.debug("fray: transfer connection closed: %r", exc)
        finally:
            with self.lock:
                self.served.pop(id(entry), None)
            entry.sock.close()

    def _answer(self, entry: Served, first: bytes, deadline: float) -> bool:
        """One request on `entry` (its first bytes already read: `first`), complete and proved by `deadline`;
        False if the reader has gone (the connection is closed then)."""
        conn = entry.sock
        try:
            head = first + recv_exact(conn, REQUEST.size - len(first), deadline)
        except ConnectionError:
            return False
        nonce, aid, offset, length, part, part_length, name_length = REQUEST.unpack(head)
        if name_length > NAME_MAX or part + part_length > length:
            raise ValueError(f"malformed request (name of {name_length} bytes, part {part}+{part_length}/{length})")
        segment = recv_exact(conn, name_length, deadline).decode()  # not UTF-8: UnicodeDecodeError, closed
        cap = self.capability(aid, segment, offset, length)
        ours = secrets.token_bytes(NONCE)
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        conn.sendall(CHALLENGE.pack(ours, proof(cap, b"owner", nonce, ours)))
        if not hmac.compare_digest(recv_exact(conn, PROOF, deadline), proof(cap, b"reader", ours, nonce)):
            raise PermissionError("a reader failed to prove its capability")
        if not self._enter(entry, Stage.SERVING):
            return False
        view = self.arena.live_view(aid, segment, offset, length)
        conn.settimeout(IO_TIMEOUT)
        if view is None:
            conn.sendall(GRANT.pack(0, 0))
            return True
        conn.sendall(GRANT.pack(1, part_length))
        key = part_key(cap, nonce, ours, part, part_length) if self.tls is None else None
        send_tagged(conn, view[part : part + part_length], key)
        return True

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (closing alone leaves it blocked)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
