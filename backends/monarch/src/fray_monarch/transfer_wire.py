"""The wire format of the data plane between hosts (transfer.py reads, transfer_server.py serves): one request,
a challenge and a proof each way, then a grant and the raw bytes. Shared by both ends, with the reads that keep
a deadline."""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import time

NONCE = 16
REQUEST = struct.Struct("!16sQQQQQH")  # reader's nonce, allocation id, offset, length, part offset, part length,
#                                        segment name length (the name follows)
CHALLENGE = struct.Struct("!16s32s")  # owner's nonce, owner's proof
PROOF = 32  # reader's proof
GRANT = struct.Struct("!BQ")  # 1 and the length of the raw bytes that follow; 0 and 0: no such live allocation
NAME_MAX = 255


def capability(key: bytes, aid: int, segment: str, offset: int, length: int) -> bytes:
    """The right to read allocation `aid` (`length` bytes at `offset` of `segment`) of the process whose key it is."""
    return hmac.new(key, f"{aid}\0{segment}\0{offset}\0{length}".encode(), hashlib.sha256).digest()


def proof(cap: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    """Proof of knowing `cap` for this exchange: its nonces (the role keeps one side's proof from being replayed
    as the other's)."""
    return hmac.new(cap, role + first + second, hashlib.sha256).digest()


def pickle_digest(data: bytes | memoryview) -> bytes:
    return hashlib.sha256(data).digest()


def recv_exact(conn: socket.socket, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray(n)
    recv_into(conn, memoryview(buf), deadline)
    return bytes(buf)


def recv_into(conn: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill `view` from `conn`; with a `deadline` (time.monotonic()), all of it by then (TimeoutError), however
    the bytes trickle in: a socket timeout alone bounds each recv, not the whole."""
    got = 0
    while got < len(view):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(view) - got} of {len(view)} bytes still missing at the deadline")
            conn.settimeout(left)
        n = conn.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the other side closed the connection")
        got += n
