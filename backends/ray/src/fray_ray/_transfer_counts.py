"""What a Ray driver counts of the values it reads, for `ctx.transfer_stats()`: its own gets, all by Ray's object
store (count, bytes where known without a walk, seconds in ray.get), and its workers' loads of device values,
counted from their events as the driver pulls them."""

from __future__ import annotations

import threading
import time

from fray.backend import RECORDER, Kind, PathStats, ProcessEvents, device_loads_in, merge

__all__ = ["STORE_PATH", "TransferCounts"]

STORE_PATH = "ray-object-store"


class TransferCounts:
    def __init__(self) -> None:
        self._gets = PathStats()  # this process's reads of stored values (ctx.get)
        self._workers_device_loads: dict[str, PathStats] = {}
        self._began_ns = time.time_ns()
        self._lock = threading.Lock()

    def count_get(self, values: int, nbytes: int, seconds: float, record: bool) -> None:
        """One get of `values` values. Recorded as a transfer event where bytes were known to move, so that the
        bytes by path add up to transfer_stats() and a round trip of a small value (0 bytes known) pays nothing."""
        with self._lock:
            self._gets = self._gets + PathStats(values, nbytes, seconds)
        if nbytes and record and RECORDER.enabled:
            RECORDER.record(Kind.TRANSFER, STORE_PATH, STORE_PATH, {"bytes": nbytes, "seconds": seconds})

    def count_device_loads(self, batches: list[ProcessEvents]) -> None:
        """The workers' loads of device values: their counters are in their processes, but each load is also one
        of their events, and the driver's pull is where every event of theirs passes once."""
        loads = device_loads_in(batches, self._began_ns)
        if loads:
            with self._lock:
                self._workers_device_loads = merge(self._workers_device_loads, loads)

    def stats(self) -> dict[str, PathStats]:
        with self._lock:
            gets, device = self._gets, self._workers_device_loads
        return merge({STORE_PATH: gets} if gets.count else {}, device)
