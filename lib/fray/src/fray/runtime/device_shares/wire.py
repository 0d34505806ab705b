"""The messages between a reader and the producer of device values, and how they travel: over a Unix stream
socket, a 4-byte length then the message pickled; file descriptors (memfd shares) beside the length
(SCM_RIGHTS); a staged snapshot's bytes raw after its `Staged` message. Both ends check that the other is
this user's process (SO_PEERCRED) before anything is read: nothing is unpickled from anyone else.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fray.errors import FrayError

__all__ = [
    "MAX_FDS",
    "Granted",
    "Lost",
    "OpenShare",
    "ReleaseLease",
    "ShareRef",
    "StageSnapshot",
    "Staged",
    "at_unix_path",
    "check_peer_is_this_user",
    "read_exactly",
    "read_message",
    "send_message",
]

_LENGTH = struct.Struct("!I")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
MAX_FDS = 16
MAX_MESSAGE = 1 << 20  # a message is a handle or a request: anything longer is not one of ours


@dataclass(frozen=True)
class ShareRef:
    """What a serialized value carries for one device snapshot: where its producer serves shares, on which host,
    which snapshot, its size, the kind of memory, and the producer's device (the host's id; None: no device)."""

    address: str
    host: str
    snapshot: int
    nbytes: int
    memory: str
    device: int | None


@dataclass(frozen=True)
class OpenShare:
    snapshot: int


@dataclass(frozen=True)
class StageSnapshot:
    snapshot: int


@dataclass(frozen=True)
class ReleaseLease:
    lease: int


@dataclass(frozen=True)
class Granted:
    """A share for this reader, held by the lease until the reader releases it or its connection closes."""

    lease: int
    handle: tuple[Any, ...]


@dataclass(frozen=True)
class Staged:
    """The snapshot's bytes follow, raw: `nbytes` of them."""

    nbytes: int


@dataclass(frozen=True)
class Lost:
    """The snapshot is gone (its value was freed)."""

    reason: str


def check_peer_is_this_user(sock: socket.socket) -> None:
    """FrayError unless the process at the other end of `sock` runs as this user (the kernel's SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _gid = _PEERCRED.unpack(raw)
    if uid != os.getuid():
        raise FrayError(f"a device-share connection from pid {pid} of uid {uid}, not this user's: refused")


def at_unix_path(address: str, act: Callable[[str], None]) -> None:
    """`act` (a socket's bind or connect) on the Unix socket path `address`, through its directory's descriptor
    where the path is too long for a Unix socket address."""
    if len(address.encode()) < 100:
        act(address)
        return
    directory = os.open(os.path.dirname(address), os.O_PATH | os.O_DIRECTORY)
    try:
        act(f"/proc/self/fd/{directory}/{os.path.basename(address)}")
    finally:
        os.close(directory)


def send_message(sock: socket.socket, message: object, fds: tuple[int, ...] | list[int] = ()) -> None:
    data = pickle.dumps(message, protocol=5)
    header = _LENGTH.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(header + data)


def read_message(sock: socket.socket) -> tuple[object, list[int]]:
    """The next message and the fds that came with it. EOFError when the other end closed."""
    header, fds, flags, _ = socket.recv_fds(sock, _LENGTH.size, MAX_FDS)
    if flags & socket.MSG_CTRUNC or not header:
        for fd in fds:
            os.close(fd)
        if not header:
            raise EOFError("the other end closed the connection")
        raise FrayError("more file descriptors came with a device-share message than one may carry")
    if len(header) < _LENGTH.size:
        header += read_exactly(sock, _LENGTH.size - len(header))
    (length,) = _LENGTH.unpack(header)
    if length > MAX_MESSAGE:
        for fd in fds:
            os.close(fd)
        raise FrayError(f"a device-share message of {length} bytes: not one of fray's")
    return pickle.loads(read_exactly(sock, length)), fds


def read_exactly(sock: socket.socket, n: int, into: memoryview | None = None) -> bytes:
    """n bytes from sock (into `into` when given: then b"" is returned). EOFError if it closes first."""
    target = into if into is not None else memoryview(bytearray(n))
    got = 0
    while got < n:
        k = sock.recv_into(target[got:n])
        if k == 0:
            raise EOFError("the other end closed the connection")
        got += k
    return b"" if into is not None else bytes(target)
