"""The reader side on one host: values mapped from their owner's shared-memory files without a copy.

numpy buffers are mapped read-only (writing raises, as with Ray). torch storages are mapped copy-on-write
(MAP_PRIVATE): a reader that writes gets private pages and never changes another reader's value. A mapping holds
a ref to its object (`pin`), so the owner cannot free and reuse the memory while it is mapped.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
import weakref
from collections import deque
from typing import Any

from fray.backend import align as _align
from fray_monarch.data.arena import Arena, open_segment

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """One mmap of a store file: the whole file, read-only, shared by every read-only view of values in it (a get
    is then O(1), as with Ray's store: pages are faulted in as the reader touches them); or one span of it,
    copy-on-write, private to one torch reader.

    A view holds a _Use (with the pin of its object); when the view dies its _Use only queues the mapping: a
    finalizer must not unmap (it can run while another thread is handing the same mapping out; unmapping there
    crashed readers). The table unmaps queued mappings that no view uses any more, under its lock."""

    def __init__(self, segment: str, offset: int, length: int | None, private: bool) -> None:
        fd = open_segment(segment)
        try:
            if length is None:
                length = os.fstat(fd).st_size
            # Neither kind is populated: a get must not cost O(size), and pages are faulted in as the reader
            # touches them (a read fault maps the file's page, with the kernel's fault-around; only a write to a
            # private page copies it). Populating a private span (read-only, then mprotect RW) costs time at map
            # time and more to unmap whatever was read; faulting lazily costs nothing for what is not read, and
            # reading or writing every page costs the same or less.
            flags = mmap.MAP_PRIVATE if private else mmap.MAP_SHARED
            prot = mmap.PROT_READ | mmap.PROT_WRITE if private else mmap.PROT_READ
            addr = _libc.mmap(None, length, prot, flags, fd, offset)
        finally:
            os.close(fd)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {segment} failed: {os.strerror(err)}")
        self.addr, self.length = addr, length
        self.users = 0
        self.segment: str | None = None  # set for a shared whole-file mapping

    def view(self, offset: int, length: int, writable: bool, pin: Any) -> memoryview:
        """Under the table's lock: `length` bytes at `offset` into this mapping."""
        raw = (ctypes.c_ubyte * length).from_address(self.addr + offset)
        raw.use = _Use(self, pin)  # type: ignore[attr-defined]
        self.users += 1
        view = memoryview(raw).cast("B")
        return view if writable else view.toreadonly()


class _Use:
    """What a view keeps alive: its mapping (counted) and the pin of its object (the owner keeps the bytes)."""

    __slots__ = ("mapping", "pin")

    def __init__(self, mapping: _Mapping, pin: Any) -> None:
        self.mapping, self.pin = mapping, pin

    def __del__(self) -> None:
        map_table.released.append(self.mapping)


class _MapTable:
    """The mappings of this process: one read-only mapping per store file, shared by every get of every value in
    it (so two gets of one value share memory); private copy-on-write mappings per torch read. A mapping is
    unmapped once no view uses it (checked on the next map, and every UNMAP_EVERY s)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.shared: dict[str, _Mapping] = {}
        self.released: deque[_Mapping] = deque()
        self.sweeper: threading.Thread | None = None
        self.arenas: weakref.WeakSet[Arena] = weakref.WeakSet()  # their leases are drained by the sweep too

    def views(self, segment: str, spans: list[tuple[int, int, bool]], pin: Any) -> list[Any]:
        """Views of (offset in file, length, private) spans of the store file `segment`."""
        out: list[Any] = []
        with self.lock:
            self._drain()
            for start, length, private in spans:
                if private:
                    own = _Mapping(segment, start, _align(length), private=True)
                    out.append(own.view(0, length, writable=True, pin=pin))
                    continue
                mapping = self.shared.get(segment)
                if mapping is None:
                    mapping = self.shared[segment] = _Mapping(segment, 0, None, private=False)
                    mapping.segment = segment
                out.append(mapping.view(start, length, writable=False, pin=pin))
            if self.sweeper is None:
                self.sweeper = threading.Thread(target=self._sweep, name="fray-unmap", daemon=True)
                self.sweeper.start()
        return out

    def _drain(self) -> None:
        """Under the lock: unmap the mappings whose last view died."""
        while self.released:
            mapping = self.released.popleft()
            mapping.users -= 1
            if mapping.users > 0:
                continue
            if mapping.segment is not None and self.shared.get(mapping.segment) is mapping:
                del self.shared[mapping.segment]
            _libc.munmap(mapping.addr, mapping.length)

    def _sweep(self) -> None:
        while True:
            time.sleep(UNMAP_EVERY)
            if self.released:
                with self.lock:
                    self._drain()
            for arena in list(self.arenas):
                if arena.released:
                    with arena.lock:
                        arena.drain_released()


map_table = _MapTable()
UNMAP_EVERY = 0.5
