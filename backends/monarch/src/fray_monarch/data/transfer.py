"""Between fray hosts: each process serves its allocations over TCP to readers of other hosts (`tcp-direct`),
or offers them as Monarch RDMABuffers where the transport is RDMA. Which one is chosen, and why, is here; the
reader's side of the sockets too (the owner's: transfer_server.py; the wire format: transfer_wire.py).

What travels where: a value's pickle stream rides the control plane, in its locator (or, when large,
its SHA-256 does, and the reader checks the bytes before unpickling); the socket carries only raw bytes of
allocations. A locator carries a capability per allocation: an HMAC, under a secret key of the owner process,
of (allocation id, segment, offset, length). It never crosses the socket: reader and owner each prove they know
it (challenge-response, a fresh nonce from each side), so a reader never hands it to, nor takes bytes from, a
stranger, and the owner serves only an allocation that is still live in its table (a freed one is refused, and
a new allocation at the same place has another id, hence another capability). The bytes of each pull carry a
tag the reader checks (transfer_wire.py), or travel inside TLS with `transport=tls` (transfer_tls.py), so a relay
on the path cannot change them either. A server that is full closes a new connection before
answering it; the reader then waits and tries again, for up to REFUSED_WAIT.
"""

from __future__ import annotations

import hmac
import logging
import random
import secrets
import socket
import ssl
import struct
import threading
import time
from typing import Any

from fray.errors import ObjectLostError
from fray_monarch.data.transfer_server import MAX_CONNECTIONS, TransferServer
from fray_monarch.data.transfer_wire import (
    CHALLENGE,
    GRANT,
    NONCE,
    REQUEST,
    TamperedError,
    part_key,
    pickle_digest,
    proof,
    recv_exact,
    recv_tagged,
)

__all__ = ["TransferServer", "choose_transport", "fetch", "pickle_digest", "value_rdma_path", "why"]

log = logging.getLogger("fray_monarch")

STREAM_MIN = 32 * 1024 * 1024  # pulls larger than this are split over parallel streams
STREAMS = 2  # parallel streams per pull: the fastest count measured (.agents/measured.md)
CONNECT_TIMEOUT = 10.0
IO_TIMEOUT = 120.0
POOL_IDLE = 30.0  # a reader reuses a pooled connection only if it was idle less than this (owner: 60 s)
REFUSED_WAIT = 30.0  # how long a reader keeps trying an owner that closes its connections unanswered (full)


class Connections:
    """Idle connections to transfer servers, reused (a new TCP connection per transfer would add its setup to
    each) while the owner keeps them (it closes those idle 60 s, or sooner when a new reader needs the place)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.idle: dict[str, list[tuple[float, socket.socket]]] = {}
        self.lock = threading.Lock()
        self.tls = tls  # transport=tls: connections are wrapped in TLS (by _challenged, once connected)

    def take(self, address: str) -> tuple[socket.socket, bool]:
        """A connection to `address` and whether it was pooled (the owner may have closed it since); a new one
        is plain TCP yet."""
        now = time.monotonic()
        with self.lock:
            pool = self.idle.get(address, [])
            while pool:
                since, conn = pool.pop()
                if now - since < POOL_IDLE:
                    return conn, True
                conn.close()
        host, port = address.rsplit(":", 1)
        conn = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
        conn.settimeout(IO_TIMEOUT)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, False

    def give(self, address: str, conn: socket.socket) -> None:
        with self.lock:
            self.idle.setdefault(address, []).append((time.monotonic(), conn))

    def close(self) -> None:
        with self.lock:
            for pool in self.idle.values():
                for _, conn in pool:
                    conn.close()
            self.idle.clear()


def _challenged(conns: Connections, value: Any, request: bytes) -> tuple[socket.socket, bytes, bytes]:
    """A connection to the owner of `value` that has taken `request` and answered with its challenge (nonce,
    proof). A connection closed before it answers was refused (the owner serves MAX_CONNECTIONS at once) or, if
    pooled, closed while idle: a pooled one is replaced at once, a fresh one tried again after a pause, doubling,
    for up to REFUSED_WAIT. Unreachable, or refused all that time: ObjectLostError."""
    lost = f"object {value.oid} is lost"
    give_up = time.monotonic() + REFUSED_WAIT
    pause = 0.01
    while True:
        try:
            conn, pooled = conns.take(value.address)
        except OSError as exc:
            raise ObjectLostError(
                f"{lost}: its owner ({value.owner} on host {value.host}) is unreachable: {exc}"
            ) from exc
        try:
            if conns.tls is not None and not pooled:
                conn = conns.tls.wrap_socket(conn)  # the handshake, within the socket's IO_TIMEOUT
            conn.sendall(request)
            theirs, owner_proof = CHALLENGE.unpack(recv_exact(conn, CHALLENGE.size))
            return conn, theirs, owner_proof
        except ssl.SSLCertVerificationError as exc:
            conn.close()
            raise ObjectLostError(
                f"{lost}: the transfer server at {value.address} (host {value.host}) presented a certificate that "
                f"is not from your fray authority ({exc.verify_message}): refused to read from it. Every host "
                "needs the same ~/.fray/tls (FRAY_TLS_DIR)"
            ) from exc
        except (ConnectionError, TimeoutError, ssl.SSLEOFError) as exc:
            conn.close()
            if pooled:
                continue
            if time.monotonic() + pause > give_up:
                raise ObjectLostError(
                    f"{lost}: its owner's transfer server at {value.address} (host {value.host}) closed every "
                    f"connection before answering for {REFUSED_WAIT:.0f} s ({exc}): it serves {MAX_CONNECTIONS} "
                    "connections at once, and its slots stayed taken; more readers at once than that wait, so "
                    "something else holds them (check who connects to that port)"
                ) from exc
            time.sleep(pause * random.uniform(0.5, 1.5))  # readers refused together do not come back together
            pause = min(pause * 2, 1.0)
        except OSError as exc:  # TLS refused by the owner (this reader's certificate), or the network failed
            conn.close()
            raise ObjectLostError(
                f"object {value.oid}: transfer from {value.address} (host {value.host}) failed: {exc}"
                + (" (transport=tls: every host needs certificates of the same fray authority)" if conns.tls else "")
            ) from exc


def fetch(conns: Connections, value: Any, part: int, length: int, target: memoryview) -> None:
    """Bytes [part, part+length) of the allocation of `value` (a Stored) into target[part:part+length], from its
    owner, once each side has proved it knows the capability."""
    lost = f"object {value.oid} is lost"
    name = value.segment.encode()
    cap = value.capability
    nonce = secrets.token_bytes(NONCE)
    request = REQUEST.pack(nonce, value.alloc, value.offset, value.length, part, length, len(name)) + name
    conn, theirs, owner_proof = _challenged(conns, value, request)
    try:
        if not hmac.compare_digest(owner_proof, proof(cap, b"owner", nonce, theirs)):
            conn.close()
            raise ObjectLostError(f"{lost}: {value.address} did not prove it is its owner (refused to read from it)")
        conn.sendall(proof(cap, b"reader", theirs, nonce))
        granted, size = GRANT.unpack(recv_exact(conn, GRANT.size))
        if not granted:
            conns.give(value.address, conn)
            raise ObjectLostError(f"{lost}: its owner no longer has it")
        if size != length:
            conn.close()
            raise ObjectLostError(f"{lost}: its owner offered {size} bytes, {length} were asked for")
        key = part_key(cap, nonce, theirs, part, length) if conns.tls is None else None
        recv_tagged(conn, target[part : part + length], key)
    except TamperedError as exc:
        conn.close()
        raise ObjectLostError(
            f"object {value.oid}: its bytes from host {value.host} ({value.address}) were changed on the way ({exc}):"
            " not used. Something between the hosts alters their traffic (a faulty device, or someone on the path);"
            " transport=tls also encrypts it"
        ) from exc
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

    auto: RDMA where ibverbs exists; else direct TCP, because Monarch 0.7's RDMA TCP fallback (one stream) is
    several times slower than fray's own sockets (docs/backends/monarch.md). rdma: RDMABuffer even over its TCP
    fallback.
    tls: direct TCP inside TLS (encrypted; transfer_tls.py), never RDMA.
    """
    if transport in ("tcp", "tls"):
        return None
    if transport == "rdma":
        return "ibverbs" if _ibverbs() else "tcp"
    if transport != "auto":
        raise ValueError(f"transport must be auto, tcp, tls or rdma, got {transport!r}")
    return "ibverbs" if _ibverbs() else None


def value_rdma_path() -> str:
    return "rdma-ibverbs" if _ibverbs() else "rdma-tcp"


def why(path: str) -> str:
    return {
        "rdma-ibverbs": "ibverbs is available",
        "rdma-tcp": "transport=rdma was asked for; no ibverbs device, so Monarch's RDMA TCP fallback",
        "tcp-direct": "no ibverbs device: fray's direct sockets beat Monarch's RDMA TCP fallback",
    }.get(path, path)
