"""Reusable memory for large copies: a stored value's buffers, a reader's private copy of a tensor.

New memory costs more than the copy into it: a fresh allocation takes a page fault for every 4 KiB page, several
times the cost of the copy itself. The pool hands out page-aligned pieces of memfd chunks and takes them back
when the last view of a piece is gone, so a value put after another reuses pages already faulted in.

A reader that needs a writable private copy of a pooled piece (a torch storage: torch has no read-only tensors)
gets a copy-on-write mapping of it instead of a copy: nothing is copied until it writes, and only the pages it
writes: mapping costs next to nothing, a reader that touches a few pages pays almost nothing, and one that reads
every page pays more than a copy into warm memory would but far less than a copy into fresh memory.

`FreeList` (first fit over sorted, coalesced free ranges) is shared with fray_monarch's shared-memory arena.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

__all__ = [
    "PAGE",
    "POOL_MIN",
    "FreeList",
    "Piece",
    "align",
    "buffer_address",
    "live_chunks",
    "locate",
    "pool_copy",
    "pool_piece",
]

PAGE = mmap.PAGESIZE
POOL_MIN = 1024 * 1024  # smaller buffers are plain bytes: their allocation is cheap
CHUNK = 64 * 1024 * 1024
RETAIN = 512 * 1024 * 1024  # fully free chunks kept (warm) up to this much, or up to the recent working set
PEAK_WINDOW = 30.0  # seconds the largest working set seen is remembered


def align(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


@dataclass
class FreeList:
    """Free ranges of one chunk: first-fit allocation, coalesced on release."""

    size: int
    free: list[tuple[int, int]] = field(default_factory=list)  # (offset, size), sorted, coalesced
    used: int = 0

    def __post_init__(self) -> None:
        if not self.free:
            self.free = [(0, self.size)]

    def take(self, size: int) -> int | None:
        """The offset of `size` bytes, or None if no free range is large enough."""
        for i, (off, n) in enumerate(self.free):
            if n >= size:
                if n == size:
                    del self.free[i]
                else:
                    self.free[i] = (off + size, n - size)
                self.used += size
                return off
        return None

    def give(self, offset: int, size: int) -> None:
        self.used -= size
        self.free.append((offset, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for off, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((off, n))
        self.free = merged


class _Chunk:
    """A memfd mapped shared (not anonymous memory): a reader can map one of its pieces copy-on-write, another
    process can write one of its pieces (fray.in_memory's channel). Where there are no memfds (not Linux),
    anonymous memory, and readers copy."""

    keys = itertools.count()

    def __init__(self, size: int) -> None:
        self.key = next(self.keys)  # names it to a process it is shared with
        self.fd: int | None = None
        if not hasattr(os, "memfd_create"):
            self.map = mmap.mmap(-1, size)
            self.ranges = FreeList(size)
            self.address = 0  # (never lent to another process: it has no fd)
            return
        self.fd = os.memfd_create("fray-pool", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.ranges = FreeList(size)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))  # where its memory starts here

    def __del__(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # its pieces' mappings stay valid: a mapping holds the file itself


class _Lease:
    """Returns its piece to the pool when the views over it are gone. The finalizer only queues: it may run
    inside the pool's own critical section (a garbage collection triggered there)."""

    __slots__ = ("chunk", "offset", "pool", "size")

    def __init__(self, pool: _Pool, chunk: _Chunk, offset: int, size: int) -> None:
        self.pool, self.chunk, self.offset, self.size = pool, chunk, offset, size

    def __del__(self) -> None:
        self.pool.returned.append((self.chunk, self.offset, self.size))


class _Pool:
    """Chunks kept warm: every chunk while the memory in use is below the largest working set of the last
    PEAK_WINDOW seconds (a loop that holds 1.5 GiB at its peak and 0.6 GiB between steps keeps 1.5 GiB, instead
    of faulting the difference in again every step), and RETAIN bytes of free chunks beyond that."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.chunks: list[_Chunk] = []
        self.returned: deque[tuple[_Chunk, int, int]] = deque()
        self.peak = 0  # bytes in use at the largest recent working set
        self.peak_at = 0.0

    def take(self, nbytes: int) -> memoryview:
        """A writable view of `nbytes` of pooled memory, returned to the pool when the view (and every view made
        from it) is gone."""
        return self.piece(nbytes).view

    def piece(self, nbytes: int) -> Piece:
        """`take`, and where the memory is (its chunk and offset)."""
        size = align(max(nbytes, 1))
        with self.lock:
            self._drain()
            for chunk in self.chunks:
                offset = chunk.ranges.take(size)
                if offset is not None:
                    break
            else:
                chunk = _Chunk(max(CHUNK, size))
                self.chunks.append(chunk)
                offset = chunk.ranges.take(size)
                assert offset is not None
            self._note_use()
        raw = (ctypes.c_ubyte * max(nbytes, 1)).from_buffer(chunk.map, offset)
        raw.lease = _Lease(self, chunk, offset, size)  # type: ignore[attr-defined]
        return Piece(memoryview(raw).cast("B")[:nbytes], chunk, offset)

    @staticmethod
    def private_mapping(view: memoryview) -> memoryview | None:
        """A writable copy-on-write mapping of `view` when it is a whole pooled piece, else None. The mapping
        keeps the piece leased: a page the reader has not written still shows the piece's memory."""
        piece = view.obj
        lease = getattr(piece, "lease", None)
        if not isinstance(piece, ctypes.Array) or not isinstance(lease, _Lease) or lease.chunk.fd is None:
            return None
        if buffer_address(view) != ctypes.addressof(piece):  # a slice of a piece: not mapped alone
            return None
        private = mmap.mmap(
            lease.chunk.fd, lease.size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE, offset=lease.offset
        )
        raw = (ctypes.c_ubyte * max(view.nbytes, 1)).from_buffer(private)
        raw.lease = lease  # type: ignore[attr-defined]
        return memoryview(raw).cast("B")[: view.nbytes]

    def locate(self, view: memoryview) -> tuple[_Chunk, int] | None:
        """The memfd chunk and offset of a buffer that lies in this pool's memory (a stored value's), else None.
        Whoever keeps `view` keeps its piece leased."""
        start = buffer_address(view)
        with self.lock:
            for chunk in self.chunks:
                if chunk.fd is not None and chunk.address <= start <= chunk.address + chunk.ranges.size - view.nbytes:
                    return chunk, start - chunk.address
        return None

    def _drain(self) -> None:
        while self.returned:
            chunk, offset, size = self.returned.popleft()
            chunk.ranges.give(offset, size)
        idle = [c for c in self.chunks if c.ranges.used == 0]
        held = sum(c.ranges.size for c in self.chunks)
        in_use = held - sum(c.ranges.size for c in idle)
        excess = held - max(in_use + RETAIN, self._recent_peak())
        for chunk in sorted(idle, key=lambda c: -c.ranges.size):
            if excess <= 0:
                break
            excess -= chunk.ranges.size
            self.chunks.remove(chunk)  # its mmap is closed when the last export of it is gone

    def _note_use(self) -> None:
        in_use = sum(c.ranges.used for c in self.chunks)
        if in_use >= self._recent_peak():
            self.peak, self.peak_at = in_use, time.monotonic()

    def _recent_peak(self) -> int:
        return self.peak if time.monotonic() - self.peak_at < PEAK_WINDOW else 0


@dataclass(frozen=True)
class Piece:
    """A writable view of pooled memory (returned to the pool when the view and every view made from it are
    gone), and where it is: its chunk (`chunk.key`, `chunk.fd`: None without memfds) and the offset in it."""

    view: memoryview
    chunk: _Chunk
    offset: int


_pool = _Pool()


def pool_piece(nbytes: int) -> Piece:
    """`nbytes` of pooled memory, for another process to write (its chunk's fd is shared with that process)."""
    return _pool.piece(nbytes)


def locate(view: memoryview) -> tuple[_Chunk, int] | None:
    """Where a buffer lies in this process's pool, if it does (see _Pool.locate)."""
    return _pool.locate(view)


def live_chunks() -> set[int]:
    """The keys of the chunks the pool holds now (a process that mapped others may unmap them)."""
    with _pool.lock:
        return {chunk.key for chunk in _pool.chunks}


def pool_copy(source: object, readonly: bool) -> memoryview | bytes:
    """A private copy of a buffer: in pooled memory when large (warm pages), else bytes (a bytearray when it
    must be writable: torch warns about, and cannot protect, read-only memory)."""
    view = memoryview(source).cast("B")  # type: ignore[arg-type]
    if view.nbytes < POOL_MIN:
        return bytes(view) if readonly else memoryview(bytearray(view))
    if not readonly and view.readonly:
        mapped = _pool.private_mapping(view)
        if mapped is not None:
            return mapped
    target = _pool.take(view.nbytes)
    ctypes.memmove(buffer_address(target), buffer_address(view), view.nbytes)  # the GIL is let go while it runs
    return target.toreadonly() if readonly else target


class _PyBuffer(ctypes.Structure):
    _fields_ = [  # CPython's Py_buffer
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]


def buffer_address(view: memoryview) -> int:
    """The address of a contiguous buffer's first byte, read-only ones too (ctypes' from_buffer wants writable)."""
    info = _PyBuffer()
    _get_buffer(view, ctypes.byref(info), 0)  # PyBUF_SIMPLE: the buffer is C-contiguous bytes
    try:
        return info.buf or 0
    finally:
        _release_buffer(ctypes.byref(info))
