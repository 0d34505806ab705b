"""Values between an in_memory process and its child (an SPMD member, a runtime_env task) through shared memory.

A message is a value serialized by fray.runtime.serialization (protocol 5): its small in-band part goes over a Unix
socket, its large buffers (arrays, tensors, big bytes) straight into the receiver's own pooled memory
(fray.runtime.pool): the sender asks for room (`_Want`), the receiver takes pieces of its pool and says where they are
(`_Given`: chunk and offset; a chunk's memfd crosses the socket once, SCM_RIGHTS), the sender copies each buffer there,
then sends the message. One copy, into warm pages the receiver keeps as the value's memory (a store keeps them as they
are), where a sender's own arena in between would take two, and pickling the value through the socket four (into
fresh memory).

A stored value's buffers that already lie in the sender's pool (an in_memory object sent to an SPMD member as a
call's argument: `send_call`) are not copied at all but lent: the receiver maps the sender's piece copy-on-write
(it reads the sender's pages and writes only private ones) and says, in a later message of its own, which lent
pieces it has dropped; until then the sender keeps them leased. So a batch that every member reads costs none of
them a copy (bench_rlhf.py); monarch's members map it the same way.

A value holding device memory (a CUDA tensor) is sent in the channel's device mode: `shared` between the
driver and a long-lived child (an SPMD member; the driver's side of a runtime_env task), where the value carries a
share of the sender's device snapshot (fray.runtime.device_shares) and the sender holds the snapshot until the receiver
says, in a later message, that the value is gone (`holds`, `released_holds`, as lent pieces are returned);
`staged` from a child that ends with its reply (a runtime_env task's result), where the bytes travel.

Messages alternate (a call, its reply): whoever sends, the other end is reading, so it answers a `_Want` at once.
Chunks are memfds: nothing in the file system to clean up, gone with the last process that maps them. Where
there are no memfds (not Linux) every buffer goes through the socket.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import pickle
import socket
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any

from fray.backend import (
    PAGE,
    POOL_MIN,
    STAGED,
    Blob,
    Piece,
    align,
    buffer_address,
    capture_exception,
    dumps,
    live_chunks,
    loads,
    locate,
    pool_piece,
)
from fray.errors import FrayError, SerializationError
from fray.kit import Serialized

__all__ = ["Channel"]

_HEADER = struct.Struct("!Q")  # the length of the frame that follows
_HAS_MEMFD = hasattr(os, "memfd_create")  # elsewhere than Linux every buffer goes through the socket
MAX_FDS = 253  # Linux's SCM_MAX_FD: the most chunk fds one frame carries


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
    """Serialized values (a call's own, then its arguments sent as they are stored: `send_call`): their in-band
    bytes, how many buffers each has and which must be private; small buffers inline, large ones in the pieces
    of the `_Given` before it (`placed`: index -> position) or lent from the sender's pool (`lent`: index ->
    chunk key, offset, size, lend id). `new`: the sender's chunks whose fds come with it; `live`: the sender's chunks
    still in its pool (when it lends); `released`: lend ids of the receiver's pieces the sender no longer maps.
    `holds`: value index -> hold id, of values that refer to device snapshots the sender holds until told;
    `released_holds`: hold ids of the receiver's values the sender no longer has."""

    data: tuple[bytes, ...]
    counts: tuple[int, ...]
    private: tuple[frozenset[int], ...]
    inline: dict[int, bytes]
    placed: dict[int, int]
    lent: dict[int, tuple[int, int, int, int]]
    new: tuple[int, ...]
    live: frozenset[int] | None
    released: tuple[int, ...]
    holds: dict[int, int]
    released_holds: tuple[int, ...]


@dataclass(frozen=True)
class _Part:
    """Stands in a call's arguments for the k-th value sent after it as it is stored (Channel.send_call)."""

    k: int


class _Returned:
    """Set on the mapping of a lent piece (on a value whose device snapshots the sender holds): when it is gone,
    the other end is told (in the next message)."""

    __slots__ = ("lend_id", "released")

    def __init__(self, released: deque[int], lend_id: int) -> None:
        self.released, self.lend_id = released, lend_id

    def __del__(self) -> None:
        self.released.append(self.lend_id)


class Channel:
    """One end of a connected Unix stream socket carrying serialized values. Not thread-safe: one sender and
    one reader at a time, messages alternating between the two ends."""

    def __init__(self, sock: socket.socket, device_mode: str = STAGED) -> None:
        self.sock = sock
        self.device_mode = device_mode  # how values sent from here carry device memory (module doc)
        self._holds: dict[int, list[Any]] = {}  # hold id -> what keeps a sent value's device snapshots served
        self._hold_ids = itertools.count()
        self._released_holds: deque[int] = deque()  # hold ids of the peer's values this end no longer has
        self._peer: dict[int, int] = {}  # the other end's chunks whose fds this end holds, by key
        self._peer_maps: dict[int, mmap.mmap] = {}  # ... mapped shared, where this end writes pieces it was given
        self._shared: set[int] = set()  # keys of this end's chunks whose fds the peer has
        self._lent: dict[int, memoryview] = {}  # lend id -> this end's buffer the peer maps (keeps it leased)
        self._lend_ids = itertools.count()
        self._released: deque[int] = deque()  # lend ids of the peer's pieces this end no longer maps

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, value: Any, what: str) -> None:
        """Serialize `value` and send it. Raises SerializationError (naming `what`) if it cannot be pickled, and
        OSError if the peer is gone."""
        self.send_blobs([dumps(value, what, copy=False, device_mode=self.device_mode)])

    def recv(self, what: str) -> Any:
        """The next value. Raises EOFError if the peer closed its end, OSError if the socket failed, and
        SerializationError (naming `what`) if the value cannot be rebuilt here."""
        return loads(self.recv_blobs(what, readers=1)[0], what)

    def send_call(self, message: tuple[Any, tuple[Any, ...], dict[str, Any]], what: str) -> None:
        """(method, args, kwargs) whose top-level Serialized arguments go as they are stored (lent, when their
        buffers lie in this process's pool), not rebuilt to be serialized again."""
        method, args, kwargs = message
        parts: list[Blob] = []

        def part(value: Any) -> Any:
            if not isinstance(value, Serialized):
                return value
            parts.append(value.blob)
            return _Part(len(parts) - 1)

        call = (method, tuple(part(a) for a in args), {k: part(v) for k, v in kwargs.items()})
        self.send_blobs([dumps(call, what, copy=False, device_mode=self.device_mode)], stored=parts)

    def recv_call(self, what: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """What send_call sent, every argument rebuilt here."""
        blobs = self.recv_blobs(what, readers=1)
        method, args, kwargs = loads(blobs[0], what)

        def value(arg: Any) -> Any:
            return loads(blobs[1 + arg.k], what) if isinstance(arg, _Part) else arg

        return method, tuple(value(a) for a in args), {k: value(v) for k, v in kwargs.items()}

    def send_outcome(self, ok: bool, value: Any, what: str) -> None:
        """A call's outcome, from the child: whether it succeeded, then its result (or RemoteError). A result
        that cannot be pickled fails the call instead (the child goes on)."""
        try:
            blob = dumps(value, what, copy=False, device_mode=self.device_mode)
        except SerializationError as exc:
            ok, blob = False, dumps(capture_exception(exc), f"the error of {what}")
        self.send(ok, "a call's status")
        self.send_blobs([blob])

    def recv_outcome(self, what: str) -> tuple[bool, Blob]:
        """What send_outcome sent: (ok, the result or RemoteError, still serialized: a store keeps it as is)."""
        ok: bool = self.recv("a call's status")
        return ok, self.recv_blobs(what)[0]

    def send_blobs(self, blobs: list[Blob], stored: list[Blob] | None = None) -> None:
        """Send values already serialized (their buffers are read before this returns), then `stored` ones: values
        as a store keeps them, which nobody writes, so their buffers that lie in this process's pool are lent.
        (Any other buffer may be written by its owner once sent, and is copied: a value sent is a snapshot.)"""
        own = sum(len(blob.buffers) for blob in blobs)
        blobs = [*blobs, *(stored or [])]
        views = [memoryview(b).cast("B") for blob in blobs for b in blob.buffers]
        large = [i for i, view in enumerate(views) if view.nbytes >= POOL_MIN] if _HAS_MEMFD else []
        lent: dict[int, tuple[int, int, int, int]] = {}
        new_chunks: dict[int, int] = {}  # key -> fd, of the chunks lent here whose fds the peer lacks
        for i in (i for i in large if i >= own):
            place = locate(views[i])
            if place is None:
                continue
            chunk, offset = place
            if chunk.key not in self._shared and chunk.key not in new_chunks:
                if len(new_chunks) == MAX_FDS or chunk.fd is None:
                    continue  # (copied instead: one frame carries at most MAX_FDS fds)
                new_chunks[chunk.key] = chunk.fd
            lend_id = next(self._lend_ids)
            self._lent[lend_id] = views[i]
            lent[i] = (chunk.key, offset, views[i].nbytes, lend_id)
        copied = [i for i in large if i not in lent]
        if copied:
            self._send_frame(_Want(tuple(views[i].nbytes for i in copied)))
            given, fds = self._read_frame()
            if not isinstance(given, _Given):
                raise FrayError(f"the other end answered a request for room with {type(given).__name__}")
            self._map_chunks(given, fds)
            for i, (key, offset) in zip(copied, given.places, strict=True):
                with memoryview(self._peer_maps[key]) as target:
                    ctypes.memmove(buffer_address(target) + offset, buffer_address(views[i]), views[i].nbytes)
        placed = {i: position for position, i in enumerate(copied)}
        inline = {i: bytes(view) for i, view in enumerate(views) if i not in placed and i not in lent}
        live = frozenset(live_chunks()) if lent else None
        released = []
        while self._released:
            released.append(self._released.popleft())
        holds = {}
        for k, blob in enumerate(blobs):
            tokens = blob.share_tokens()
            if tokens:
                holds[k] = next(self._hold_ids)
                self._holds[holds[k]] = tokens
        released_holds = []
        while self._released_holds:
            released_holds.append(self._released_holds.popleft())
        message = _Message(
            tuple(b.data for b in blobs),
            tuple(len(b.buffers) for b in blobs),
            tuple(b.private for b in blobs),
            inline,
            placed,
            lent,
            tuple(new_chunks),
            live,
            tuple(released),
            holds,
            tuple(released_holds),
        )
        self._send_frame(message, list(new_chunks.values()))
        self._shared.update(new_chunks)
        if live is not None:
            self._shared &= live

    def recv_blobs(self, what: str, readers: int = 0) -> list[Blob]:
        """The next values, serialized: their large buffers in this process's pooled memory, or mapped from the
        sender's. readers=0 (a store keeps them: any number may read them): every buffer read-only, so each
        reader of a torch storage gets its own copy. readers=1 (each is loaded once): a torch storage's buffer
        is writable, its one reader uses it in place (a lent one copy-on-write)."""
        frame, fds = self._read_frame()
        pieces: list[Piece] = []
        if isinstance(frame, _Want):
            pieces = [pool_piece(n) for n in frame.sizes]
            self._give(pieces)
            frame, fds = self._read_frame()
        if not isinstance(frame, _Message):
            for fd in fds:
                os.close(fd)
            raise FrayError(f"{what}: the other end sent {type(frame).__name__} instead of a value")
        for lend_id in frame.released:
            self._lent.pop(lend_id, None)
        for hold_id in frame.released_holds:
            self._holds.pop(hold_id, None)
        self._hold_fds(frame.new, fds, frame.live)
        private = {sum(frame.counts[:k]) + i for k, indices in enumerate(frame.private) for i in indices}
        buffers: list[Any] = []
        for i in range(sum(frame.counts)):
            if i in frame.inline:
                buffers.append(frame.inline[i])
                continue
            view = pieces[frame.placed[i]].view if i in frame.placed else self._borrow(*frame.lent[i])
            buffers.append(view if readers == 1 and i in private else view.toreadonly())
        blobs, start = [], 0
        for k, (data, count, own) in enumerate(zip(frame.data, frame.counts, frame.private, strict=True)):
            hold = frame.holds.get(k)
            keep: list[Any] = [] if hold is None else [_Returned(self._released_holds, hold)]
            blobs.append(Blob(data, buffers[start : start + count], private=own, keep=keep))
            start += count
        return blobs

    def _borrow(self, key: int, offset: int, nbytes: int, lend_id: int) -> memoryview:
        """A copy-on-write mapping of a piece the sender lent (it is told when the mapping is gone)."""
        fd = self._peer.get(key)
        if fd is None:
            raise FrayError(f"the other end lent a piece of chunk {key}, whose fd it never sent")
        start = offset // PAGE * PAGE  # (a mapping starts on a page)
        private = mmap.mmap(
            fd, align(offset - start + nbytes), mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE, offset=start
        )
        raw = (ctypes.c_ubyte * nbytes).from_buffer(private, offset - start)
        raw.returned = _Returned(self._released, lend_id)  # type: ignore[attr-defined]
        return memoryview(raw).cast("B")

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
        """Map the receiver's chunks where pieces were given (new ones' fds come with it); let go of those its
        pool let go."""
        self._hold_fds(given.new, fds, given.live)
        for key, _ in given.places:
            if key not in self._peer_maps:
                self._peer_maps[key] = mmap.mmap(self._peer[key], os.fstat(self._peer[key]).st_size)

    def _hold_fds(self, keys: tuple[int, ...], fds: list[int], live: frozenset[int] | None) -> None:
        """Keep the fds of the peer's chunks that came with a frame; close those of chunks its pool let go."""
        if len(fds) != len(keys):
            for fd in fds:
                os.close(fd)
            raise FrayError(f"{len(keys)} chunks announced, {len(fds)} fds arrived")
        self._peer.update(zip(keys, fds, strict=True))
        if live is None:
            return
        for key in [k for k in self._peer if k not in live]:
            os.close(self._peer.pop(key))
            shared = self._peer_maps.pop(key, None)
            if shared is not None:
                shared.close()

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
        for chunk in self._peer_maps.values():
            try:
                chunk.close()
            except BufferError:  # a copy into it still in flight when the channel is closed: the GC unmaps
                pass
        self._peer_maps.clear()
        for fd in self._peer.values():
            os.close(fd)
        self._peer.clear()
        self._lent.clear()  # (the peer is gone, or going: its mappings hold the memory it still uses)
        self._holds.clear()
        self.sock.close()
