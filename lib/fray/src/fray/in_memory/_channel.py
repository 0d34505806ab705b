"""Values between an in_memory process and its child (an SPMD member, a runtime_env task) through shared memory.

A message is a value serialized by fray.serialization (protocol 5): its small in-band part goes over a Unix
socket, its large buffers (arrays, tensors, big bytes) straight into the receiver's own pooled memory (fray.pool):
the sender asks for room (`_Want`), the receiver takes pieces of its pool and says where they are (`_Given`: chunk
and offset; a chunk's memfd crosses the socket once, SCM_RIGHTS), the sender copies each buffer there, then sends
the message. One copy, into warm pages the receiver keeps as the value's memory (a store keeps them as they are).
Before: the sender copied into an arena of its own and the receiver out of it into its pool (two copies), and
before that a value was pickled, written through the socket, read and unpickled (four, into fresh memory).

Messages alternate (a call, its reply): whoever sends, the other end is reading, so it answers a `_Want` at once.
Chunks are memfds: nothing in the file system to clean up, gone with the last process that maps them. Where
there are no memfds (not Linux) every buffer goes through the socket.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any

from fray.errors import FrayError, SerializationError
from fray.pool import POOL_MIN, Piece, buffer_address, live_chunks, pool_piece
from fray.remote_errors import capture_exception
from fray.serialization import Blob, dumps, loads

__all__ = ["Channel", "Serialized"]

_HEADER = struct.Struct("!Q")  # the length of the frame that follows
_HAS_MEMFD = hasattr(os, "memfd_create")  # elsewhere than Linux every buffer goes through the socket
MAX_FDS = 253  # Linux's SCM_MAX_FD: the most chunk fds one frame carries


@dataclass(frozen=True)
class Serialized:
    """A method's result that arrived serialized from a child process: the store keeps its blob as it is (its
    buffers are already this process's own memory), instead of rebuilding the value to serialize it again."""

    blob: Blob


@dataclass(frozen=True)
class _Want:
    """The sender's request for room: one piece per large buffer, of these sizes."""

    sizes: tuple[int, ...]


@dataclass(frozen=True)
class _Given:
    """The receiver's answer: (chunk key, offset) of each piece; the keys of the chunks whose fds come with this
    frame (in order); the keys of every chunk its pool still holds (the sender unmaps the others)."""

    places: tuple[tuple[int, int], ...]
    new: tuple[int, ...]
    live: frozenset[int]


@dataclass(frozen=True)
class _Message:
    """A value: its in-band bytes, its small buffers (by index) and which piece of the `_Given` before it holds
    each large one (index -> position)."""

    data: bytes
    inline: dict[int, bytes]
    placed: dict[int, int]
    count: int
    private: frozenset[int]


class Channel:
    """One end of a connected Unix stream socket carrying serialized values. Not thread-safe: one sender and
    one reader at a time, messages alternating between the two ends."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._peer: dict[int, mmap.mmap] = {}  # the receiver's chunks this end writes, by key
        self._shared: set[int] = set()  # keys of this end's chunks whose fds the peer has

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
        views = [memoryview(b).cast("B") for b in blob.buffers]
        large = [i for i, view in enumerate(views) if view.nbytes >= POOL_MIN] if _HAS_MEMFD else []
        if large:
            self._send_frame(_Want(tuple(views[i].nbytes for i in large)))
            given, fds = self._read_frame()
            if not isinstance(given, _Given):
                raise FrayError(f"the other end answered a request for room with {type(given).__name__}")
            self._map_chunks(given, fds)
            for i, (key, offset) in zip(large, given.places, strict=True):
                with memoryview(self._peer[key]) as target:
                    ctypes.memmove(buffer_address(target) + offset, buffer_address(views[i]), views[i].nbytes)
        placed = {i: position for position, i in enumerate(large)}
        inline = {i: bytes(view) for i, view in enumerate(views) if i not in placed}
        self._send_frame(_Message(blob.data, inline, placed, len(views), blob.private))

    def recv_blob(self, what: str, readers: int = 0) -> Blob:
        """The next value, serialized: its large buffers in this process's pooled memory. readers=0 (a store
        keeps it: any number may read it): every buffer read-only, so each reader of a torch storage gets its
        own copy. readers=1 (`recv` loads it once): a torch storage's buffer is writable, its one reader uses it
        in place."""
        frame, _ = self._read_frame()
        pieces: list[Piece] = []
        if isinstance(frame, _Want):
            pieces = [pool_piece(n) for n in frame.sizes]
            self._give(pieces)
            frame, _ = self._read_frame()
        if not isinstance(frame, _Message):
            raise FrayError(f"{what}: the other end sent {type(frame).__name__} instead of a value")
        buffers: list[Any] = []
        for i in range(frame.count):
            if i in frame.inline:
                buffers.append(frame.inline[i])
            else:
                view = pieces[frame.placed[i]].view
                buffers.append(view if readers == 1 and i in frame.private else view.toreadonly())
        return Blob(frame.data, buffers, private=frame.private)

    def _give(self, pieces: list[Piece]) -> None:
        """Tell the sender where the pieces are, with the fds of the chunks it has not mapped yet."""
        new = list({p.chunk.key: p.chunk for p in pieces if p.chunk.key not in self._shared}.values())
        if len(new) > MAX_FDS:
            raise FrayError(f"a value of {len(pieces)} large buffers needs {len(new)} new chunks (at most {MAX_FDS})")
        fds = [chunk.fd for chunk in new if chunk.fd is not None]
        assert len(fds) == len(new), "pooled chunks are memfds wherever the channel asks for room"
        given = _Given(
            tuple((p.chunk.key, p.offset) for p in pieces), tuple(c.key for c in new), frozenset(live_chunks())
        )
        self._send_frame(given, fds)
        self._shared.update(chunk.key for chunk in new)
        self._shared &= given.live

    def _map_chunks(self, given: _Given, fds: list[int]) -> None:
        """Map the receiver's new chunks (their fds closed once mapped); unmap those its pool let go."""
        try:
            if len(fds) != len(given.new):
                raise FrayError(f"{len(given.new)} chunks announced, {len(fds)} fds arrived")
            for key, fd in zip(given.new, fds, strict=True):
                self._peer[key] = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED)
        finally:
            for fd in fds:
                os.close(fd)
        for key in [k for k in self._peer if k not in given.live]:
            self._peer.pop(key).close()

    def _send_frame(self, frame: object, fds: list[int] | None = None) -> None:
        message = pickle.dumps(frame, protocol=5)
        header = _HEADER.pack(len(message))
        if fds:
            socket.send_fds(self.sock, [header], fds)
        else:
            self.sock.sendall(header)
        self.sock.sendall(message)

    def _read_frame(self) -> tuple[object, list[int]]:
        header, fds = self._read_header()
        return pickle.loads(self._read_exactly(_HEADER.unpack(header)[0])), fds

    def _read_header(self) -> tuple[bytes, list[int]]:
        data, fds, flags, _addr = socket.recv_fds(self.sock, _HEADER.size, MAX_FDS)
        if flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            raise FrayError("more file descriptors arrived than a frame may carry")
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
        for chunk in self._peer.values():
            try:
                chunk.close()
            except BufferError:  # a copy into it still in flight when the channel is closed: the GC unmaps
                pass
        self._peer.clear()
        self.sock.close()
