"""The wire format of the data plane between hosts (transfer.py reads, transfer_server.py serves): one request,
a challenge and a proof each way, then a grant, the raw bytes and their tag. Shared by both ends, with the reads
that keep a deadline.

The tags (issue 29, item 4) make the bytes as trustworthy as the ends: each CHUNK of a request's bytes is
followed by its GMAC (AES-256-GCM with the chunk as associated data and nothing to encrypt; the chunk's index is
the nonce, so chunks cannot be reordered, dropped or moved to another pull) under a key only the two ends can
derive: HMAC-SHA256, under the capability (which never crosses the socket), of both fresh nonces and the part,
hence a new key for every request. GMAC, not HMAC-SHA256 or Poly1305: ~9-11 GB/s on one core here (AES-NI and
carry-less multiply) against ~0.6 and ~4.5, measured on benchmarks/bench_hosts.py. Over TLS (transport=tls) the
bytes carry no tag: TLS protects them, and encrypts them too.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import time

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE = 16
REQUEST = struct.Struct("!16sQQQQQH")  # reader's nonce, allocation id, offset, length, part offset, part length,
#                                        segment name length (the name follows)
CHALLENGE = struct.Struct("!16s32s")  # owner's nonce, owner's proof
PROOF = 32  # reader's proof
GRANT = struct.Struct("!BQ")  # 1 and the length of the raw bytes that follow; 0 and 0: no such live allocation
NAME_MAX = 255
TAG = 16  # the GMAC tag after each chunk
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
    """The key of one request's tags: both ends derive it, nobody without the capability can, and the fresh
    nonces make it new every time (so a chunk index is never a nonce twice under one key)."""
    what = b"bytes" + reader_nonce + owner_nonce + struct.pack("!QQ", part, length)
    return hmac.new(cap, what, hashlib.sha256).digest()


def _tag(gmac: AESGCM, index: int, chunk: memoryview) -> bytes:
    return gmac.encrypt(index.to_bytes(12, "big"), b"", chunk)  # nothing encrypted: the tag of `chunk` alone


def send_tagged(conn: socket.socket, view: memoryview, key: bytes | None) -> None:
    """`view` a CHUNK at a time, each followed (with a `key`) by its tag."""
    gmac = AESGCM(key) if key is not None else None
    for index, start in enumerate(range(0, len(view), CHUNK)):
        chunk = view[start : start + CHUNK]
        conn.sendall(chunk)
        if gmac is not None:
            conn.sendall(_tag(gmac, index, chunk))


def recv_tagged(conn: socket.socket, view: memoryview, key: bytes | None) -> None:
    """Fill `view` a CHUNK at a time, checking (with a `key`) the tag after each: TamperedError if one does not
    match, before anything else is read."""
    gmac = AESGCM(key) if key is not None else None
    for index, start in enumerate(range(0, len(view), CHUNK)):
        chunk = view[start : start + CHUNK]
        recv_into(conn, chunk)
        if gmac is not None and not hmac.compare_digest(recv_exact(conn, TAG), _tag(gmac, index, chunk)):
            end = start + len(chunk)
            raise TamperedError(f"bytes {start}-{end} of the {len(view)} received do not match their tag")


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
