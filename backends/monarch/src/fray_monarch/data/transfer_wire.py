"""The wire format of the data plane between hosts (transfer.py reads, transfer_server.py serves): one request,
a challenge and a proof each way, then a grant, the raw bytes and their tag. Shared by both ends, with the reads
that keep a deadline.

The tag makes the bytes as trustworthy as the ends: after the bytes of each request comes
their GMAC (AES-256-GCM over no plaintext, the bytes as associated data: NIST SP 800-38D), under a key only the two
ends can derive: HMAC-SHA256, under the capability (which never crosses the socket), of both fresh nonces and the
part, hence a new key for every request (so GCM's fixed nonce never serves two messages). GMAC through
cryptography's streaming cipher context: it tags faster than Poly1305 and far faster than HMAC-SHA256, releases
the GIL, and keeps a pull close to the untagged rate; tagging a chunk in a second thread while the next one moves
is slower on few cores (benchmarks/bench_hosts.py; docs/backends/monarch.md, "The data plane", has the runs).
Over TLS (transport=tls) the bytes carry no tag: TLS protects them, and encrypts them too.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.ciphers import AEADEncryptionContext, Cipher, algorithms, modes

NONCE = 16
REQUEST = struct.Struct("!16sQQQQQH")  # reader's nonce, allocation id, offset, length, part offset, part length,
#                                        segment name length (the name follows)
CHALLENGE = struct.Struct("!16s32s")  # owner's nonce, owner's proof
PROOF = 32  # reader's proof
GRANT = struct.Struct("!BQ")  # 1 and the length of the raw bytes that follow; 0 and 0: no such live allocation
NAME_MAX = 255
TAG = 16  # the GMAC tag after the bytes of each grant
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
    """The one-time GMAC key of one request's bytes: both ends derive it, nobody without the capability can,
    and the fresh nonces make it new every time."""
    what = b"bytes" + reader_nonce + owner_nonce + struct.pack("!QQ", part, length)
    return hmac.new(cap, what, hashlib.sha256).digest()


_NONCE = bytes(12)  # GCM's nonce: fixed, as every key tags one message only (part_key)


def _gmac(key: bytes) -> AEADEncryptionContext:
    """GMAC: AES-GCM over no plaintext, the bytes as associated data; cryptography releases the GIL meanwhile."""
    return Cipher(algorithms.AES(key), modes.GCM(_NONCE)).encryptor()


def _tag(mac: AEADEncryptionContext) -> bytes:
    mac.finalize()
    return mac.tag


def _move_and_tag(view: memoryview, move: Callable[[memoryview], object], mac: AEADEncryptionContext | None) -> None:
    """`move` each CHUNK of `view` (send or receive it); add each to `mac` once it has moved (still in cache)."""
    for start in range(0, len(view), CHUNK):
        chunk = view[start : start + CHUNK]
        move(chunk)
        if mac is not None:
            mac.authenticate_additional_data(chunk)


def send_tagged(conn: socket.socket, view: memoryview, key: bytes | None) -> None:
    """`view` a CHUNK at a time, then (with a `key`) its tag."""
    mac = _gmac(key) if key is not None else None
    _move_and_tag(view, conn.sendall, mac)
    if mac is not None:
        conn.sendall(_tag(mac))


def recv_tagged(conn: socket.socket, view: memoryview, key: bytes | None) -> None:
    """Fill `view` a CHUNK at a time and (with a `key`) check the tag that follows: TamperedError if it does not
    match (the caller then discards all of `view`)."""
    mac = _gmac(key) if key is not None else None
    _move_and_tag(view, lambda chunk: recv_into(conn, chunk), mac)
    if mac is not None and not hmac.compare_digest(recv_exact(conn, TAG), _tag(mac)):
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
