"""Which path each object transfer took, how many bytes and how long: `ctx.transfer_stats()`.

Every backend counts the reads of stored values (a `get`, a task or actor argument resolved from a ref) by the
path the bytes took to reach the reader:

- ``inline``: small values carried in the control-plane message itself;
- ``shm``: mapped from the shared memory of the reader's own host, without a copy;
- ``rdma-ibverbs`` / ``rdma-tcp``: pulled from the owner's host with Monarch's RDMABuffer (its TCP fallback);
- ``tcp-direct``: pulled straight from the owner's host over one or more sockets;
- ``in-process`` (in_memory) and ``ray-object-store`` (ray): the engine's own store;
- ``cuda-device-copy`` / ``cuda-staged``: a CUDA tensor's storage copied on its device for a reader in the same
  process, or carried through pinned host memory and copied onto the reader's device (fray.runtime.cuda_values; its
  host bytes are also counted under the path they took);
- ``cuda-ipc`` / ``cuda-ipc-staged``: a CUDA tensor's snapshot read by another process of its host, through a
  share of its device memory, or staged through host memory by its producer where the reader cannot open one
  (fray.runtime.device_shares); ``memfd-ipc`` / ``memfd-ipc-staged``: the same for the CPU stand-in of device memory.

Those are the names fray's own backends use (`KNOWN_PATHS`); the set is open: a backend names its own paths
with any short lowercase name (`PATH_NAME`: `my-engine-store`), and should reuse one of these where its bytes
take that way. Counters are per process; a backend with several processes sums them (see
`JobContext.transfer_stats`).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from fray.telemetry.events import RECORDER, Kind, ProcessEvents

__all__ = [
    "DEVICE_PATHS",
    "KNOWN_PATHS",
    "PATH_NAME",
    "PathStats",
    "TransferReport",
    "TransferStats",
    "device_loads_in",
    "device_stats",
    "merge",
    "since",
]

PATH_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")  # what a path's name looks like (the suite checks it)
DEVICE_PATHS = (  # the loads of device values (`device_stats`)
    "cuda-device-copy",
    "cuda-staged",
    "cuda-ipc",
    "cuda-ipc-staged",
    "memfd-ipc",
    "memfd-ipc-staged",
)
KNOWN_PATHS = (
    "inline",
    "shm",
    "rdma-ibverbs",
    "rdma-tcp",
    "tcp-direct",
    "in-process",
    "ray-object-store",
    *DEVICE_PATHS,
)


@dataclass(frozen=True)
class PathStats:
    """What one path moved: how many transfers, their bytes and the seconds they took (summed)."""

    count: int = 0
    bytes: int = 0
    seconds: float = 0.0

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def __add__(self, other: PathStats) -> PathStats:
        return PathStats(self.count + other.count, self.bytes + other.bytes, self.seconds + other.seconds)


def _size(nbytes: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} B"


class TransferReport(dict[str, PathStats]):
    """What `ctx.transfer_stats()` returns: a dict of path -> PathStats that prints as one line a path,
    `shm: 12 transfers, 1.5 GiB in 0.21 s (7.7 GB/s)`."""

    def __str__(self) -> str:
        if not self:
            return "no transfers recorded"
        lines = []
        for path, stats in sorted(self.items()):
            rate = f" ({stats.gb_per_s:.1f} GB/s)" if stats.seconds > 0 else ""
            many = "transfer" if stats.count == 1 else "transfers"
            lines.append(f"{path}: {stats.count} {many}, {_size(stats.bytes)} in {stats.seconds:.3g} s{rate}")
        return "\n".join(lines)


class TransferStats:
    """Thread-safe counters of one process, by path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: dict[str, list[float]] = {}  # path -> [count, bytes, seconds]: every value read pays this

    def record(self, path: str, nbytes: int, seconds: float, source: str | None = None) -> None:
        """A read of `nbytes` by `path` that took `seconds`, into this process, from `source` where the backend
        knows it (the process that held the value: its host and key)."""
        data: dict[str, object] = {"bytes": nbytes, "seconds": seconds}
        if source is not None:
            data["from"] = source
        RECORDER.record(Kind.TRANSFER, path, path, data)
        with self._lock:
            counts = self._paths.get(path)
            if counts is None:
                counts = self._paths[path] = [0, 0, 0.0]
            counts[0] += 1
            counts[1] += nbytes
            counts[2] += seconds

    @contextmanager
    def timed(self, path: str, nbytes: int) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.record(path, nbytes, time.perf_counter() - start)

    def snapshot(self) -> dict[str, PathStats]:
        with self._lock:
            return {path: PathStats(int(c[0]), int(c[1]), c[2]) for path, c in self._paths.items()}

    def reset(self) -> None:
        with self._lock:
            self._paths.clear()


def since(now: Mapping[str, PathStats], base: Mapping[str, PathStats]) -> dict[str, PathStats]:
    """What was counted after `base` was read (of one set of counters, read again as `now`)."""
    out: dict[str, PathStats] = {}
    for path, stats in now.items():
        before = base.get(path, PathStats())
        if stats.count > before.count:
            out[path] = PathStats(
                stats.count - before.count, stats.bytes - before.bytes, max(0.0, stats.seconds - before.seconds)
            )
    return out


def merge(*parts: Mapping[str, PathStats]) -> dict[str, PathStats]:
    out: dict[str, PathStats] = {}
    for part in parts:
        for path, stats in part.items():
            out[path] = out.get(path, PathStats()) + stats
    return out


def device_loads_in(batches: Iterable[ProcessEvents], since_ns: int = 0) -> dict[str, PathStats]:
    """The loads of device values that the processes of `batches` recorded (their transfer events on
    DEVICE_PATHS) from `since_ns` on: how a backend that cannot ask its workers' counters, but pulls their
    events, counts what they loaded."""
    out: dict[str, list[float]] = {}
    for batch in batches:
        for event in batch.events:
            if event.kind == Kind.TRANSFER and event.key in DEVICE_PATHS and event.t >= since_ns and event.data:
                counts = out.setdefault(str(event.key), [0, 0, 0.0])
                counts[0] += 1
                counts[1] += int(event.data.get("bytes", 0))
                counts[2] += float(event.data.get("seconds", 0.0))
    return {path: PathStats(int(c[0]), int(c[1]), c[2]) for path, c in out.items()}


device_stats = TransferStats()  # this process's loads of device values (merged into ctx.transfer_stats())
