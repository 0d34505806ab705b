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

from fray_monarch.arena import Arena, _align

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Mapping:
    """One mmap of a span of a store file, and how many buffer views use it.

    A view holds a _Use; when the view dies its _Use only queues the mapping (a finalizer must not unmap: it can
    run while another thread is handing the same mapping out, and unmapping there crashed readers). The table
    below unmaps queued mappings that no view uses any more, under its lock."""

    def __init__(self, path: str, offset: int, length: int, private: bool, pin: Any) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            flags = (mmap.MAP_PRIVATE if private else mmap.MAP_SHARED) | mmap.MAP_POPULATE
            # Populated read-only even when private: populating a writable private mapping would copy every page.
            addr = _libc.mmap(None, length, mmap.PROT_READ, flags, fd, offset)
        finally:
            os.close(fd)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {path} failed: {os.strerror(err)}")
        if private and _libc.mprotect(addr, length, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
            _libc.munmap(addr, length)
            raise OSError(ctypes.get_errno(), "mprotect failed")
        self.addr, self.length, self.pin = addr, length, pin
        self.users = 0
        self.key: tuple[str, int, int] | None = None

    def view(self, length: int, writable: bool) -> memoryview:
        """Under the table's lock."""
        raw = (ctypes.c_ubyte * length).from_address(self.addr)
        raw.use = _Use(self)  # type: ignore[attr-defined]
        self.users += 1
        view = memoryview(raw).cast("B")
        return view if writable else view.toreadonly()


class _Use:
    __slots__ = ("mapping",)

    def __init__(self, mapping: _Mapping) -> None:
        self.mapping = mapping

    def __del__(self) -> None:
        _maps.released.append(self.mapping)


class _MapTable:
    """The mappings of this process: read-only ones shared by key (segment, offset, allocation), so every get of
    one value returns views of one mapping; unmapped once no view uses them (checked every UNMAP_EVERY s)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.shared: dict[tuple[str, int, int], _Mapping] = {}
        self.released: deque[_Mapping] = deque()
        self.sweeper: threading.Thread | None = None
        self.arenas: weakref.WeakSet[Arena] = weakref.WeakSet()  # their leases are drained by the sweep too

    def views(self, path: str, spans: list[tuple[int, int, bool, tuple[str, int, int]]], pin: Any) -> list[Any]:
        out: list[Any] = []
        with self.lock:
            self._drain()
            for start, length, private, key in spans:
                mapping = None if private else self.shared.get(key)
                if mapping is None:
                    mapping = _Mapping(path, start, _align(length), private, pin)
                    if not private:
                        mapping.key = key
                        self.shared[key] = mapping
                out.append(mapping.view(length, writable=private))
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
            if mapping.key is not None and self.shared.get(mapping.key) is mapping:
                del self.shared[mapping.key]
            _libc.munmap(mapping.addr, mapping.length)
            mapping.pin = None  # the owner may free the value now (if nothing else holds it)

    def _sweep(self) -> None:
        while True:
            time.sleep(UNMAP_EVERY)
            if self.released:
                with self.lock:
                    self._drain()
            for arena in list(self.arenas):
                if arena.released:
                    with arena.lock:
                        arena._drain_released()


_maps = _MapTable()
UNMAP_EVERY = 0.5
