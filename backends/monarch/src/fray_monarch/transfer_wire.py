"""The wire format of the data plane between hosts (transfer.py reads, transfer_server.py serves): one request,
a challenge and a proof each way, then a grant, the raw bytes and their tag. Shared by both ends, with the reads
that keep a deadline.

The tag (issue 29, item 4) makes the bytes as trustworthy as the ends: after the bytes of each request comes
their Poly1305 MAC, under a key only the two ends can derive: HMAC-SHA256, under the capability (which never
crosses the socket), of both fresh nonces and the part, hence a new key for every request (Poly1305 must never
tag two messages under one key). Poly1305 rather than HMAC-SHA256 (~0.6 GB/s on one core here, with SHA-NI) or
GMAC (~9-11 GB/s alone, against Poly1305's ~4.5): on benchmarks/bench_hosts.py, Poly1305 tagging while sending
kept ~0.85x of the untagged pull's p50 rate (medians of 7 interleaved runs), a GMAC after each 4 MiB ~0.75x
(docs/backends/monarch.md has the runs). Over TLS (transport=tls) the bytes carry no tag: TLS protects them,
and encrypts them too.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import time

from cryptography.hazmat.primitives.poly1305 import Poly1305

NONCE = 16
REQUEST = struct.Struct("!16sQQQQQH")  # reader's nonce, allocation id, offset, length, part offset, part length,
#                                        segment name length (the name follows)
CHALLENGE = struct.Struct("!16s32s")  # owner's nonce, owner's proof
PROOF = 32  # reader's proof
GRANT = struct.Struct("!BQ")  # 1 and the length of the raw bytes that follow; 0 and 0: no such live allocation
NAME_MAX = 255
TAG = 16  # the Poly1305 tag after the bytes of each grant
CHUNK = 4 * 1024 * 1024  # the bytes go out, come in and are tagged this much at a time


class TamperedError(ConnectionError):
    """The bytes of a pull do not match their tag: something between the hosts changed them."""


def capability(key: bytes, aid: int, segment: str, offset: int, length: int) -> bytes:
    """The right to read allocation `aid` (`length` bytes at `offset` of `segment`) of the process whose key it is."""
    return hmac.new(key, f"{aid}\0{segment}\0{offset}\0{length}".encode(), hashlib.sha256).digest()


def proof(cap: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    """Proof of knowing `cap` for this exchange: its nonces (the role keeps one side's proof from being replayed
    as the other's)."""
    return hmac.new(cap, role + first + second, hashlib.sha256).digest()


def part_key(cap: bytes, reader_nonce: bytes, owner_nonce: bytes, part: int, length: int) -> bytes:
    """The one-time Poly1305 key of one request's bytes: both ends derive it, nobody without the capability can,
    and the fresh nonces make it new every time."""
    what = b"bytes" + reader_nonce + owner_nonce + struct.pack("!QQ", part, length)
    return hmac.new(cap, what, hashlib.sha256).digest()


def send_tagged(conn: socket.socket, view: memoryview, key: bytes | None) -> None:
    """`view` a CHUNK at a time (each added to the MAC before it goes), then (with a `key`) its tag."""
    mac = Poly1305(key) if key is not None else None
    for start in range(0, len(view), CHUNK):
        chunk = view[start : start + CHUNK]
        if mac is not None:
            mac.update(chunk)
        conn.sendall(chunk)
    if mac is not None:
        conn.sendall(mac.finalize())


def recv_tagged(conn: socket.socket, view: memoryview, key: bytes | None) -> None:
    """Fill `view` a CHUNK at a time and (with a `key`) check the tag that follows: TamperedError if it does not
    match (the caller then discards all of `view`)."""
    mac = Poly1305(key) if key is not None else None
    for start in range(0, len(view), CHUNK):
        chunk = view[start : start + CHUNK]
        recv_into(conn, chunk)
        if mac is not None:
            mac.update(chunk)
    if mac is not None and not hmac.compare_digest(recv_exact(conn, TAG), mac.finalize()):
        raise TamperedError(f"the {len(view)} bytes received do not match their tag")


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
