"""Device memory as the share protocol sees it, and its CPU stand-in.

The protocol (fray.runtime.device_shares.producer and .reader) never touches a device itself: it asks a `DeviceMemory`
to make a flat snapshot of a value's bytes, to hand out one share of a snapshot per reader, to open a share and
copy it into the reader's own memory, and to stage a snapshot through host bytes where a share cannot be opened.
CUDA memory is one implementation (fray.runtime.device_shares.cuda_memory); `MemfdMemory` is another, with memfd
segments standing in for device memory, so every lifetime and failure case of the protocol runs on a machine
without a GPU. A memfd share is the segment's file descriptor, passed over the producer's socket (SCM_RIGHTS); a
CUDA share is a handle of bytes (`_share_cuda_`), passed in the message itself.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DeviceMemory",
    "DeviceOpenError",
    "MemfdBuffer",
    "MemfdMemory",
    "MemfdSegment",
    "Share",
    "memfd_memory",
]


class DeviceOpenError(Exception):
    """The reader cannot open a share (its process does not see the device, another container, a MIG slice):
    it asks the producer to stage the value instead."""


@dataclass(frozen=True)
class Share:
    """One reader's share of a snapshot: a small picklable handle, and the file descriptors that travel with it."""

    handle: tuple[Any, ...]
    fds: tuple[int, ...] = ()


class DeviceMemory(Protocol):
    """What the share protocol needs of a kind of device memory."""

    name: str  # names its transfer paths: f"{name}-ipc", f"{name}-ipc-staged"

    def snapshot(self, source: Any) -> Any:
        """A flat copy of `source`'s bytes that nobody else writes, complete when shared (producer)."""
        ...

    def nbytes(self, snapshot: Any) -> int: ...

    def share(self, snapshot: Any) -> Share:
        """A share of `snapshot` for one reader (producer)."""
        ...

    def unopenable(self, device: int | None, where: Any) -> str | None:
        """Why this process could not open a share of a snapshot on `device` (the host's id) onto `where`, known
        before asking for one; None when it may. A share handed out and never opened may hold the producer's
        memory (torch counts each CUDA share until a reader opens and drops it), so a reader asks for none then."""
        ...

    def open_copy(self, share: Share, fds: list[int], where: Any) -> Any:
        """Open a share, copy it into this process's own memory on `where`, let go of the share; the copy
        (reader). Raises DeviceOpenError when this process cannot open it."""
        ...

    def open_alias(self, share: Share, fds: list[int], where: Any) -> tuple[Any, Callable[[], None]]:
        """Open a share and give the producer's snapshot itself, to be read only, not copied (reader, for a get
        into the caller's own memory: fray.runtime.borrowing); and a callable that returns once every read of it
        queued so far is done. Raises DeviceOpenError as open_copy does."""
        ...

    def stage(self, snapshot: Any) -> memoryview:
        """The snapshot's bytes in host memory (producer, for a reader that cannot open a share)."""
        ...

    def host_buffer(self, nbytes: int) -> memoryview:
        """Host memory for `nbytes` staged bytes to land in, that `upload` copies from at the bus's speed
        (reader: pinned memory for CUDA)."""
        ...

    def upload(self, data: memoryview, where: Any) -> Any:
        """Staged bytes as a value of this memory on `where` (reader)."""
        ...

    def free(self, snapshot: Any) -> None:
        """The snapshot's memory goes back (producer: the value is dropped and no reader holds a share)."""
        ...


class MemfdSegment:
    """Bytes in an anonymous memory file: the CPU stand-in's unit of "device memory"."""

    __slots__ = ("fd", "map", "nbytes")

    def __init__(self, nbytes: int, fd: int | None = None) -> None:
        self.nbytes = nbytes
        self.fd = os.memfd_create("fray-device-stand-in", os.MFD_CLOEXEC) if fd is None else fd
        if fd is None and nbytes:
            os.ftruncate(self.fd, nbytes)
        self.map = mmap.mmap(self.fd, nbytes) if nbytes else None

    def view(self) -> memoryview:
        return memoryview(self.map) if self.map is not None else memoryview(b"")

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class MemfdBuffer:
    """A value held in stand-in device memory (a memfd segment of this process). Sent to another process it
    travels as a CUDA tensor does (fray.runtime.device_shares), so tests exercise that path on any machine."""

    __slots__ = ("segment",)

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        with memoryview(data) as raw, raw.cast("B") as view:
            self.segment = MemfdSegment(view.nbytes)
            with self.segment.view() as target:
                target[:] = view

    @classmethod
    def adopt(cls, segment: MemfdSegment) -> MemfdBuffer:
        buf = cls.__new__(cls)
        buf.segment = segment
        return buf

    def tobytes(self) -> bytes:
        with self.segment.view() as view:
            return bytes(view)

    def copy_from(self, other: MemfdBuffer) -> None:
        """Write `other`'s bytes over this buffer's (of the same size): the stand-in of a device tensor's copy_."""
        if other.nbytes != self.nbytes:
            raise ValueError(f"a MemfdBuffer of {self.nbytes} bytes cannot take {other.nbytes} bytes")
        with self.segment.view() as target, other.segment.view() as source:
            target[:] = source

    def write_at(self, offset: int, data: bytes) -> None:
        with self.segment.view() as view:
            view[offset : offset + len(data)] = data

    @property
    def nbytes(self) -> int:
        return self.segment.nbytes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemfdBuffer) and self.tobytes() == other.tobytes()

    def __hash__(self) -> int:
        return hash(self.tobytes())

    def __repr__(self) -> str:
        return f"MemfdBuffer({self.nbytes} bytes)"

    def __reduce__(self) -> tuple[Any, ...]:
        # (a pickler other than fray's, which chooses the way by its device mode: the bytes travel in the value)
        return (MemfdBuffer, (self.tobytes(),))

    def __del__(self) -> None:
        self.segment.close()


class MemfdMemory:
    """DeviceMemory over memfd segments. `refuse_open` makes this process a reader that cannot open shares
    (as a process that does not see the producer's device): it then asks for staging."""

    name = "memfd"

    def __init__(self) -> None:
        self.refuse_open = False

    def snapshot(self, source: Any) -> MemfdSegment:
        with source.segment.view() if isinstance(source, MemfdBuffer) else memoryview(source).cast("B") as view:
            segment = MemfdSegment(view.nbytes)
            with segment.view() as target:
                target[:] = view
        return segment

    def nbytes(self, snapshot: Any) -> int:
        return int(snapshot.nbytes)

    def share(self, snapshot: Any) -> Share:
        return Share((snapshot.nbytes,), (snapshot.fd,))

    def unopenable(self, device: int | None, where: Any) -> str | None:
        return "this process was set to refuse device shares (MemfdMemory.refuse_open)" if self.refuse_open else None

    def open_copy(self, share: Share, fds: list[int], where: Any) -> MemfdBuffer:
        alias = self._open(share, fds)
        try:
            with alias.view() as view:
                return MemfdBuffer(view)
        finally:
            alias.close()

    def open_alias(self, share: Share, fds: list[int], where: Any) -> tuple[MemfdBuffer, Callable[[], None]]:
        # (a copy out of the mapping is done when it returns: nothing is left to wait for)
        return MemfdBuffer.adopt(self._open(share, fds)), _nothing_queued

    def _open(self, share: Share, fds: list[int]) -> MemfdSegment:
        """The snapshot's segment mapped here (the reader's view of it); the share's descriptors are closed."""
        try:
            if self.refuse_open:
                raise DeviceOpenError("this process was set to refuse device shares (MemfdMemory.refuse_open)")
            if len(fds) != 1:
                raise DeviceOpenError(f"a memfd share came with {len(fds)} file descriptors, not 1")
            (nbytes,) = share.handle
            return MemfdSegment(nbytes, fd=os.dup(fds[0]))
        finally:
            for fd in fds:
                os.close(fd)

    def stage(self, snapshot: Any) -> memoryview:
        return snapshot.view()  # type: ignore[no-any-return]

    def host_buffer(self, nbytes: int) -> memoryview:
        return memoryview(bytearray(nbytes))

    def upload(self, data: memoryview, where: Any) -> MemfdBuffer:
        return MemfdBuffer(data)

    def free(self, snapshot: Any) -> None:
        snapshot.close()


def _nothing_queued() -> None:
    pass


memfd_memory = MemfdMemory()  # this process's one: its refuse_open is what tests switch
