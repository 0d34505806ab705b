"""Values between an in_memory process and its child (an SPMD member, a runtime_env task) through shared memory.

A message is a value serialized by fray.serialization (protocol 5): its small in-band part goes over a Unix
socket, its large buffers (arrays, tensors, big bytes) through an arena: a memfd the sending side owns, mapped
by both sides, whose fd crosses the socket once (SCM_RIGHTS) and again only when the arena grows. The sender
copies each buffer into the arena once; the reader copies it out once into its own pooled memory, so the arena
is free again as soon as `recv` returns and the next message reuses its warm pages (a fresh 100 MiB costs more
in page faults than the copy: fray.pool). Before, a value was pickled into bytes, written through the socket,
read into bytes and unpickled: four copies, each into fresh memory.

Messages alternate (a call, its reply), so a side never writes its arena while the other still reads it.
The arena is a memfd: nothing in the file system to clean up, gone with the last process that maps it.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any

from fray.errors import FrayError, SerializationError
from fray.pool import POOL_MIN, align, pool_copy
from fray.remote_errors import capture_exception
from fray.serialization import Blob, dumps, loads

__all__ = ["Channel", "Serialized"]

_HEADER = struct.Struct("!Q")  # the length of the message that follows
_HAS_MEMFD = hasattr(os, "memfd_create")  # elsewhere than Linux every buffer goes through the socket
ARENA_STEP = 64 * 1024 * 1024  # an arena grows in steps of this much (and never shrinks while its channel lives)


@dataclass(frozen=True)
class Serialized:
    """A method's result that arrived serialized from a child process: the store keeps its blob as it is (its
    buffers are already this process's own copies), instead of rebuilding the value to serialize it again."""

    blob: Blob


@dataclass(frozen=True)
class _Message:
    """What crosses the socket: the in-band bytes and where each buffer is (inline or in the arena)."""

    data: bytes
    inline: dict[int, bytes]  # small buffers, by index
    placed: dict[int, tuple[int, int]]  # index -> (offset, size) in the sender's arena
    count: int
    private: frozenset[int]


class _Arena:
    """A memfd mapped shared: one side writes it, the other maps the same pages."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)

    @classmethod
    def create(cls, size: int) -> _Arena:
        fd = os.memfd_create("fray-channel", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view of it still lives (a copy in flight when the channel is closed): the GC unmaps
            pass
        os.close(self.fd)


class Channel:
    """One end of a connected Unix stream socket carrying serialized values. Not thread-safe: one sender and
    one reader at a time, messages alternating between the two ends."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._out: _Arena | None = None  # the arena this end writes
        self._in: _Arena | None = None  # the peer's arena, mapped here

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, value: Any, what: str) -> None:
        """Serialize `value` and send it. Raises SerializationError (naming `what`) if it cannot be pickled, and
        OSError if the peer is gone."""
        self.send_blob(dumps(value, what, copy=False))

    def recv(self, what: str) -> Any:
        """The next value. Raises EOFError if the peer closed its end, OSError if the socket failed, and
        SerializationError (naming `what`) if the value cannot be rebuilt here."""
        return loads(self.recv_blob(what, readers=1), what)

    def send_outcome(self, ok: bool, value: Any, what: str) -> None:
        """A call's outcome, from the child: whether it succeeded, then its result (or RemoteError). A result
        that cannot be pickled fails the call instead (the child goes on)."""
        try:
            blob = dumps(value, what, copy=False)
        except SerializationError as exc:
            ok, blob = False, dumps(capture_exception(exc), f"the error of {what}")
        self.send(ok, "a call's status")
        self.send_blob(blob)

    def recv_outcome(self, what: str) -> tuple[bool, Blob]:
        """What send_outcome sent: (ok, the result or RemoteError, still serialized: a store keeps it as is)."""
        ok: bool = self.recv("a call's status")
        return ok, self.recv_blob(what)

    def send_blob(self, blob: Blob) -> None:
        """Send a value already serialized (its buffers are read before this returns)."""
        sizes = [memoryview(b).nbytes for b in blob.buffers]
        offsets: dict[int, tuple[int, int]] = {}
        end = 0
        for i, n in enumerate(sizes):
            if n >= POOL_MIN and _HAS_MEMFD:
                offsets[i] = (end, n)
                end += align(n)
        fds: list[int] = []
        if offsets and (self._out is None or self._out.size < end):
            if self._out is not None:
                self._out.close()
            self._out = _Arena.create(-(-end // ARENA_STEP) * ARENA_STEP)
            fds.append(self._out.fd)
        if offsets:
            assert self._out is not None
            target = memoryview(self._out.map)
            try:
                for i, (offset, n) in offsets.items():
                    target[offset : offset + n] = memoryview(blob.buffers[i]).cast("B")
            finally:
                target.release()
        inline = {i: bytes(memoryview(b).cast("B")) for i, b in enumerate(blob.buffers) if i not in offsets}
        message = pickle.dumps(_Message(blob.data, inline, offsets, len(sizes), blob.private), protocol=5)
        header = _HEADER.pack(len(message))
        if fds:
            socket.send_fds(self.sock, [header], fds)
        else:
            self.sock.sendall(header)
        self.sock.sendall(message)

    def recv_blob(self, what: str, readers: int = 0) -> Blob:
        """The next value, serialized: its large buffers in this process's pooled memory, the arena free again.
        readers=0 (a store keeps it: any number may read it): every buffer read-only, so each reader of a torch
        storage gets its own copy. readers=1 (`recv` loads it once): a torch storage's buffer is writable, its
        one reader uses it in place."""
        header, fds = self._read_header()
        for fd in fds:  # the peer's arena grew: map the new one
            if self._in is not None:
                self._in.close()
            self._in = _Arena(fd, os.fstat(fd).st_size)
        message = pickle.loads(self._read_exactly(_HEADER.unpack(header)[0]))
        assert isinstance(message, _Message)
        buffers: list[Any] = []
        for i in range(message.count):
            if i in message.inline:
                buffers.append(message.inline[i])
                continue
            if self._in is None:
                raise FrayError(f"{what}: a buffer in shared memory arrived before its arena")
            offset, n = message.placed[i]
            source = memoryview(self._in.map)[offset : offset + n]
            try:
                buffers.append(pool_copy(source, readonly=readers != 1 or i not in message.private))
            finally:
                source.release()
        return Blob(message.data, buffers, private=message.private)

    def _read_header(self) -> tuple[bytes, list[int]]:
        data, fds, _flags, _addr = socket.recv_fds(self.sock, _HEADER.size, 4)
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError("the other end closed the channel")
        if len(data) < _HEADER.size:
            data += self._read_exactly(_HEADER.size - len(data))
        return data, fds

    def _read_exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise EOFError("the other end closed the channel")
            got += k
        return bytes(buf)

    def close(self) -> None:
        for arena in (self._out, self._in):
            if arena is not None:
                arena.close()
        self._out = self._in = None
        self.sock.close()
