"""Pinned host memory for staging device values, sized to them and given back when unused.

A device value staged through host memory (fray.runtime.cuda_values, fray.runtime.device_shares.cuda_memory) is
copied at the bus's speed only into memory the CUDA driver has pinned. torch's caching host allocator rounds
every request up to a power of two and keeps all it ever pinned for the life of the process, so each worker
would keep its largest value's next power of two pinned forever. Here a request gets a region of its own size
(rounded to the page), mapped anonymously and registered with the driver (`cudaHostRegister`); once nothing uses
it, it waits as a spare for a request of the same size (a training loop stages the same sizes every step), and a
spare is given back (unregistered, unmapped) when it has not been used for `IDLE_SECONDS`, or when the spares
would hold more than FRAY_PINNED_KEEP_BYTES. Spares are looked at whenever a region is taken or comes back.

The pinning itself is a `HostPinning`: CUDA's, or none (`NO_PINNING`: the regions stay pageable), which the
tests use to run this bookkeeping on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fray.host import settings
from fray.runtime.pool import PAGE, align

__all__ = ["IDLE_SECONDS", "NO_PINNING", "CudaHostPinning", "HostPinning", "PinnedPool", "cuda_pinned", "cuda_pool"]

IDLE_SECONDS = 60.0  # a spare unused this long is given back


class HostPinning(Protocol):
    """How a region of host memory is made (and unmade) one the device copies into at the bus's speed."""

    def pin(self, address: int, nbytes: int) -> None: ...

    def unpin(self, address: int) -> None: ...


class _NoPinning:
    def pin(self, address: int, nbytes: int) -> None:
        pass

    def unpin(self, address: int) -> None:
        pass


NO_PINNING: HostPinning = _NoPinning()
CUDA_HOST_REGISTER_PORTABLE = 1  # (cuda_runtime_api.h: cudaHostRegisterPortable)


class CudaHostPinning:
    """cudaHostRegister / cudaHostUnregister, through torch's binding of the CUDA runtime. Registered portable,
    as torch's own pinning of existing memory is: pinned for every device of the process, not only the current."""

    def pin(self, address: int, nbytes: int) -> None:
        import torch

        torch.cuda.check_error(
            torch.cuda.cudart().cudaHostRegister(address, nbytes, CUDA_HOST_REGISTER_PORTABLE)  # type: ignore[no-untyped-call]
        )

    def unpin(self, address: int) -> None:
        import torch

        torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(address))  # type: ignore[no-untyped-call]


@dataclass(eq=False)
class _Region:
    map: mmap.mmap
    array: Any  # a ctypes array over the map: its address, and what each view is made from
    nbytes: int
    last_used: float = field(default=0.0)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


class _Lent:
    """Owns a region while a view of it lives: the last view gone, the region goes back to its pool."""

    __slots__ = ("give_back", "region")

    def __init__(self, region: _Region, give_back: Callable[[_Region], None]) -> None:
        self.region = region
        self.give_back = give_back

    def __del__(self) -> None:
        self.give_back(self.region)


class PinnedPool:
    """Pinned host regions by exact (page-rounded) size, reused while recently used; see the module doc."""

    def __init__(
        self,
        pinning: HostPinning,
        keep_bytes: int | None = None,
        idle_seconds: float = IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pinning = pinning
        self.keep_bytes = settings.PINNED_KEEP_BYTES.read() if keep_bytes is None else keep_bytes
        self.idle_seconds = idle_seconds
        self.clock = clock
        self._spares: list[_Region] = []  # least recently used first
        # Re-entrant: a view freed by a garbage collection that runs inside a section holding the lock gives its
        # region back on the same thread, where a plain Lock would deadlock.
        self._lock = threading.RLock()
        self._pinned_bytes = 0

    def take(self, nbytes: int) -> memoryview:
        """A writable view of `nbytes` pinned bytes, this caller's until the view (and every view made of it) is
        gone."""
        size = max(PAGE, align(nbytes))
        with self._lock:
            gone = self._drop_idle(self.clock())
            region = next((r for r in self._spares if r.nbytes == size), None)
            if region is not None:
                self._spares.remove(region)
        for old in gone:
            self._drop(old)
        if region is None:
            region = self._make(size)
        view = (ctypes.c_ubyte * nbytes).from_address(region.address)
        view.lent = _Lent(region, self._give_back)  # type: ignore[attr-defined]  # (the view keeps it)
        return memoryview(view).cast("B")

    def spare_bytes(self) -> int:
        with self._lock:
            return sum(r.nbytes for r in self._spares)

    def pinned_bytes(self) -> int:
        """Every region's bytes, spare or in use."""
        with self._lock:
            return self._pinned_bytes

    def release_spares(self) -> None:
        """Give back every spare now."""
        with self._lock:
            spares, self._spares = self._spares, []
        for region in spares:
            self._drop(region)

    def _make(self, size: int) -> _Region:
        mapped = mmap.mmap(-1, size)
        array = (ctypes.c_ubyte * size).from_buffer(mapped)
        region = _Region(mapped, array, size)
        try:
            self.pinning.pin(region.address, size)
        except BaseException:
            region.array = None
            del array
            mapped.close()
            raise
        with self._lock:
            self._pinned_bytes += size
        return region

    def _give_back(self, region: _Region) -> None:
        now = self.clock()
        region.last_used = now
        with self._lock:
            self._spares.append(region)
            gone = self._drop_idle(now)
            while sum(r.nbytes for r in self._spares) > self.keep_bytes:
                gone.append(self._spares.pop(0))
        for old in gone:
            self._drop(old)

    def _drop_idle(self, now: float) -> list[_Region]:
        """Take the spares unused for idle_seconds out of the list (lock held); the caller drops them."""
        idle = [r for r in self._spares if now - r.last_used >= self.idle_seconds]
        for region in idle:
            self._spares.remove(region)
        return idle

    def _drop(self, region: _Region) -> None:
        try:
            self.pinning.unpin(region.address)
        finally:
            region.array = None
            region.map.close()
            with self._lock:
                self._pinned_bytes -= region.nbytes


_cuda_pool: list[PinnedPool] = []
_cuda_pool_lock = threading.Lock()


def cuda_pool() -> PinnedPool:
    """This process's pool of host memory pinned for CUDA (made on first use)."""
    with _cuda_pool_lock:
        if not _cuda_pool:
            _cuda_pool.append(PinnedPool(CudaHostPinning()))
        return _cuda_pool[0]


def cuda_pinned(nbytes: int) -> memoryview:
    """`nbytes` of host memory pinned for CUDA, from this process's pool (see the module doc)."""
    return cuda_pool().take(nbytes)
