"""Between fray hosts: each process serves its allocations over TCP to readers of other hosts (`tcp-direct`),
or offers them as Monarch RDMABuffers where the transport is RDMA. Which one is chosen, and why, is here.

What travels where (issue 20): a value's pickle stream rides the control plane, in its locator (or, when large,
its SHA-256 does, and the reader checks the bytes before unpickling); the socket carries only raw bytes of
allocations. A locator carries a capability per allocation: an HMAC, under a secret key of the owner process,
of (allocation id, segment, offset, length). It never crosses the socket: reader and owner each prove they know
it (challenge-response, a fresh nonce from each side), so a reader never hands it to, nor takes bytes from, a
stranger, and the owner serves only an allocation that is still live in its table (a freed one is refused, and
a new allocation at the same place has another id, hence another capability). A connection that has not
authenticated within AUTH_TIMEOUT, or sends anything malformed, is closed; at most MAX_CONNECTIONS are served at
once (more are closed at accept).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import struct
import threading
import time
from typing import Any

from fray.errors import ObjectLostError
from fray_monarch.arena import Arena

log = logging.getLogger("fray_monarch")

STREAM_MIN = 32 * 1024 * 1024  # pulls larger than this are split over parallel streams
STREAMS = 2  # parallel streams per pull: 2 reached ~2 GB/s over loopback on 2 cores, 1 ~1.6, 4 ~1.7
CONNECT_TIMEOUT = 10.0
IO_TIMEOUT = 120.0
AUTH_TIMEOUT = 10.0  # a connection must have sent a request and proved its capability within this
IDLE_TIMEOUT = 60.0  # the owner closes an authenticated connection idle this long ...
POOL_IDLE = 30.0  # ... so a reader reuses a pooled connection only if it was idle less than this
MAX_CONNECTIONS = 64  # connections served at once (a thread each); more are closed at accept
NAME_MAX = 255

NONCE = 16
_REQUEST = struct.Struct("!16sQQQQQH")  # reader's nonce, allocation id, offset, length, part offset, part length,
#                                         segment name length (the name follows)
_CHALLENGE = struct.Struct("!16s32s")  # owner's nonce, owner's proof
_PROOF = 32  # reader's proof
_GRANT = struct.Struct("!BQ")  # 1 and the length of the raw bytes that follow; 0 and 0: no such live allocation


def capability(key: bytes, aid: int, segment: str, offset: int, length: int) -> bytes:
    """The right to read allocation `aid` (`length` bytes at `offset` of `segment`) of the process whose key it is."""
    return hmac.new(key, f"{aid}\0{segment}\0{offset}\0{length}".encode(), hashlib.sha256).digest()


def _proof(cap: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    """Proof of knowing `cap` for this exchange: its nonces (the role keeps one side's proof from being replayed
    as the other's)."""
    return hmac.new(cap, role + first + second, hashlib.sha256).digest()


def pickle_digest(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


class TransferServer:
    """Serves this process's live allocations to readers on other hosts that prove their capability: one thread
    per connection, MAX_CONNECTIONS at most."""

    def __init__(self, arena: Arena, bind_host: str) -> None:
        self.arena = arena
        self.key = secrets.token_bytes(32)  # never leaves this process: capabilities are derived from it
        self.sock = socket.create_server((bind_host, 0), backlog=64)
        self.address = f"{bind_host}:{self.sock.getsockname()[1]}"
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.closed = False
        threading.Thread(target=self._accept, name="fray-transfer-server", daemon=True).start()

    def capability(self, aid: int, segment: str, offset: int, length: int) -> bytes:
        return capability(self.key, aid, segment, offset, length)

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if not self.slots.acquire(blocking=False):
                log.warning(
                    "fray: transfer server at %s: %d connections already, one more closed",
                    self.address,
                    MAX_CONNECTIONS,
                )
                conn.close()
                continue
            conn.settimeout(AUTH_TIMEOUT)  # before anything is read from it
            threading.Thread(target=self._serve, args=(conn,), name="fray-transfer", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while self._answer(conn):
                    conn.settimeout(IDLE_TIMEOUT)
        except Exception as exc:  # malformed, unauthenticated, timed out, gone: this connection only
            log.debug("fray: transfer connection closed: %r", exc)
        finally:
            self.slots.release()

    def _answer(self, conn: socket.socket) -> bool:
        """One request on `conn`; False if the reader has gone (the connection is closed then)."""
        try:
            head = _recv_exact(conn, _REQUEST.size)
        except ConnectionError:
            return False
        conn.settimeout(AUTH_TIMEOUT)
        nonce, aid, offset, length, part, part_length, name_length = _REQUEST.unpack(head)
        if name_length > NAME_MAX or part + part_length > length:
            raise ValueError(f"malformed request (name of {name_length} bytes, part {part}+{part_length}/{length})")
        segment = _recv_exact(conn, name_length).decode()  # not UTF-8: UnicodeDecodeError, closed
        cap = self.capability(aid, segment, offset, length)
        ours = secrets.token_bytes(NONCE)
        conn.sendall(_CHALLENGE.pack(ours, _proof(cap, b"owner", nonce, ours)))
        if not hmac.compare_digest(_recv_exact(conn, _PROOF), _proof(cap, b"reader", ours, nonce)):
            raise PermissionError("a reader failed to prove its capability")
        view = self.arena.live_view(aid, segment, offset, length)
        if view is None:
            conn.sendall(_GRANT.pack(0, 0))
            return True
        conn.settimeout(IO_TIMEOUT)
        conn.sendall(_GRANT.pack(1, part_length))
        conn.sendall(view[part : part + part_length])
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


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(conn, memoryview(buf))
    return bytes(buf)


def _recv_into(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the other side closed the connection")
        got += n


class _Connections:
    """Idle connections to transfer servers, reused (a new TCP connection per transfer costs ~0.1 ms) while the
    owner keeps them (it closes those idle IDLE_TIMEOUT)."""

    def __init__(self) -> None:
        self.idle: dict[str, list[tuple[float, socket.socket]]] = {}
        self.lock = threading.Lock()

    def take(self, address: str) -> socket.socket:
        now = time.monotonic()
        with self.lock:
            pool = self.idle.get(address, [])
            while pool:
                since, conn = pool.pop()
                if now - since < POOL_IDLE:
                    return conn
                conn.close()
        host, port = address.rsplit(":", 1)
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
        conn.settimeout(IO_TIMEOUT)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def give(self, address: str, conn: socket.socket) -> None:
        with self.lock:
            self.idle.setdefault(address, []).append((time.monotonic(), conn))

    def close(self) -> None:
        with self.lock:
            for pool in self.idle.values():
                for _, conn in pool:
                    conn.close()
            self.idle.clear()


def fetch(conns: _Connections, value: Any, part: int, length: int, target: memoryview) -> None:
    """Bytes [part, part+length) of the allocation of `value` (a Stored) into target[part:part+length], from its
    owner, once each side has proved it knows the capability."""
    lost = f"object {value.oid} is lost"
    try:
        conn = conns.take(value.address)
    except OSError as exc:
        raise ObjectLostError(f"{lost}: its owner ({value.owner} on host {value.host}) is unreachable: {exc}") from exc
    name = value.segment.encode()
    cap = value.capability
    nonce = secrets.token_bytes(NONCE)
    try:
        conn.sendall(_REQUEST.pack(nonce, value.alloc, value.offset, value.length, part, length, len(name)) + name)
        theirs, proof = _CHALLENGE.unpack(_recv_exact(conn, _CHALLENGE.size))
        if not hmac.compare_digest(proof, _proof(cap, b"owner", nonce, theirs)):
            conn.close()
            raise ObjectLostError(f"{lost}: {value.address} did not prove it is its owner (refused to read from it)")
        conn.sendall(_proof(cap, b"reader", theirs, nonce))
        granted, size = _GRANT.unpack(_recv_exact(conn, _GRANT.size))
        if not granted:
            conns.give(value.address, conn)
            raise ObjectLostError(f"{lost}: its owner no longer has it")
        if size != length:
            conn.close()
            raise ObjectLostError(f"{lost}: its owner offered {size} bytes, {length} were asked for")
        _recv_into(conn, target[part : part + length])
    except (OSError, ConnectionError, struct.error) as exc:
        conn.close()
        raise ObjectLostError(f"object {value.oid}: transfer from {value.address} failed: {exc}") from exc
    conns.give(value.address, conn)


# --------------------------------------------------------------------------------------- transports
def _ibverbs() -> bool:
    try:
        from monarch.rdma import is_ibverbs_available

        return bool(is_ibverbs_available())
    except Exception:
        return False


def choose_transport(transport: str) -> str | None:
    """The RDMA backend this process's values are offered over (None: direct TCP).

    auto: RDMA where ibverbs exists; else direct TCP, because Monarch 0.7's RDMA TCP fallback moves ~0.25 GB/s
    here (one stream), against ~1-2 GB/s for fray's own sockets. rdma: RDMABuffer even over its TCP fallback.
    """
    if transport == "tcp":
        return None
    if transport == "rdma":
        return "ibverbs" if _ibverbs() else "tcp"
    if transport != "auto":
        raise ValueError(f"transport must be auto, tcp or rdma, got {transport!r}")
    return "ibverbs" if _ibverbs() else None


def value_rdma_path() -> str:
    return "rdma-ibverbs" if _ibverbs() else "rdma-tcp"


def why(path: str) -> str:
    return {
        "rdma-ibverbs": "ibverbs is available",
        "rdma-tcp": "transport=rdma was asked for; no ibverbs device, so Monarch's RDMA TCP fallback",
        "tcp-direct": "no ibverbs device: fray's direct sockets beat Monarch's RDMA TCP fallback",
    }.get(path, path)
