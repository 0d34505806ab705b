"""CUDA tensors in fray's serializer: never through torch's own pickle (a pageable device-to-host copy and the
bytes in-band, far below the bus's speed), and never silently back on the CPU.

One storage per dump (views sharing it share it again when loaded), moved one of three ways, as the dump asks:
- ``kept`` (a reader in this same process: in_memory's tasks and actors): the storage is copied on its device
  at dump time and kept in a table of this process while the serialized value lives; each load copies it again
  on the device. A value sent stays a snapshot, and no reader's writes reach another's (``cuda-device-copy``).
- ``staged`` (a reader in another process, on this host or another): copied once into pinned host memory
  (fray.runtime.pinned: the pinned copy runs at the bus's speed, many times a pageable one's),
  carried as an out-of-band buffer by the backend's data plane like a CPU tensor's bytes (shared memory,
  sockets, Ray's object store), and copied onto the reader's device (``cuda-staged``).
- ``shared`` (a reader in another process of this host): snapshotted once on the device and served by this
  process's share server; each reader opens a share of its own (CUDA IPC), copies into its own memory and lets
  go, or has the producer stage it where it cannot open one (fray.runtime.device_shares: ``cuda-ipc``,
  ``cuda-ipc-staged``). The snapshot is served while the serialized value lives.

The reader's device: the same device as the writer's where the reader sees it (devices are compared by the
host's ids, fray.runtime.gpus: a worker pinned to device 3 calls it cuda:0, the driver cuda:3), else the reader's
current CUDA device. A reader without CUDA gets the tensor on the CPU, with a warning (once per process) that says so.

Streams (torch orders work per stream; a tensor used on another stream than the one that wrote it needs a wait,
and `record_stream` so that its memory is not reused while that stream still reads it):
- A value is dumped once all work queued on its device before the dump is done (`torch.cuda.synchronize` of that
  device): the writer may have used a side stream that the dump cannot know (a task returning a tensor it made
  under `torch.cuda.stream(s)`), and a snapshot must hold what was written. Waiting costs nothing where the
  device is idle; a staged dump waited for its own copy anyway.
- A kept copy is made on the dumping thread's current stream, with an event recorded after it; a reader (maybe
  on another stream: another thread, or `torch.cuda.stream(...)`) waits for that event on its current stream and
  records that stream on the kept memory, so freeing the value while the reader's copy is queued cannot hand that
  memory to other work first.

A get into the caller's own tensors (`get(out=...)`, fray.runtime.borrowing) makes no copy of its own on the way:
a kept value is read from the kept copy, a staged one uploaded from the staged bytes, a shared one read from the
producer's snapshot, each straight into `out` (paths ``cuda-device-copy-out``, ``cuda-staged-out``,
``cuda-ipc-out``).
"""

from __future__ import annotations

import itertools
import pickle
import threading
import time
import warnings
from typing import Any

from fray.errors import FrayError
from fray.runtime.borrowing import current_borrows
from fray.runtime.device_shares.cuda_memory import cuda_memory
from fray.runtime.device_shares.producer import publish
from fray.runtime.device_shares.reader import rebuild_shared
from fray.runtime.device_shares.values import KEPT, SHARED, STAGED
from fray.runtime.device_shares.wire import ShareRef
from fray.runtime.gpus import discover
from fray.runtime.pinned import cuda_pinned
from fray.telemetry.transfers import device_stats

__all__ = ["KEPT", "SHARED", "STAGED", "CudaStorage", "KeptToken", "device_stats"]


_kept: dict[int, tuple[Any, Any]] = {}  # token -> (a storage copied on its device by a dump here, the event after it)
# Re-entrant: a KeptToken freed by a garbage collection that runs inside a section holding the lock (any
# allocation there may start one) takes it again on the same thread, where a plain Lock would deadlock.
_kept_lock = threading.RLock()
_tokens = itertools.count(1)
_warned_cpu = [False]


class KeptToken:
    """Owns one entry of the kept table: the serialized value (Blob.keep) holds it; the entry goes with it."""

    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token

    def __del__(self) -> None:
        with _kept_lock:
            _kept.pop(self.token, None)


class CudaStorage:
    """One CUDA storage inside one dump (the pickler's `storages` holds it, so views share it)."""

    __slots__ = ("pickler", "storage")

    def __init__(self, storage: Any, pickler: Any) -> None:
        self.storage = storage
        self.pickler = pickler  # None once its dump is done (serialization breaks the cycle)

    def __reduce__(self) -> tuple[Any, ...]:
        import torch

        storage = self.storage
        device = storage.device
        source = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
        if source.numel():
            torch.cuda.synchronize(device)  # every stream's work on it so far, side streams too (module doc)
        if getattr(self.pickler, "device_mode", STAGED) == KEPT:
            stream = torch.cuda.current_stream(device)
            source.record_stream(stream)  # (its memory stays the writer's until this copy has read it)
            copy = source.clone()  # on the device, on this thread's current stream
            copied = torch.cuda.Event()  # type: ignore[no-untyped-call]  # (untyped in torch)
            copied.record(stream)
            token = next(_tokens)
            with _kept_lock:
                _kept[token] = (copy.untyped_storage(), copied)
            self.pickler.keep.append(KeptToken(token))
            return (_rebuild_kept, (token, copy.nbytes))
        if source.numel() == 0:
            return (_rebuild_staged, (b"", _host_id(device.index)))
        if getattr(self.pickler, "device_mode", STAGED) == SHARED:
            ref, share_token = publish(cuda_memory, storage, _host_id(device.index))
            self.pickler.keep.append(share_token)  # the snapshot is served while the serialized value lives
            return (_rebuild_shared, (ref,))
        pinned = cuda_pinned(source.numel())  # (its memory goes back to the pool when the serialized value is gone)
        with torch.cuda.device(device):
            # A pinned destination: a DMA at the bus's speed; returns once the bytes are here.
            torch.frombuffer(pinned, dtype=torch.uint8).copy_(source)
        return (_rebuild_staged, (pickle.PickleBuffer(pinned), _host_id(device.index)))


def _host_id(ordinal: int | None) -> int:
    """The host's id of this process's CUDA device `ordinal` (its place in CUDA_VISIBLE_DEVICES)."""
    ids = discover().ids
    index = ordinal or 0
    return ids[index] if index < len(ids) else index


def _reader_device() -> Any:
    """torch.cuda where this process has CUDA, else None."""
    import torch

    return torch.cuda if torch.cuda.is_available() else None


def _target(host_id: int) -> Any:
    """The device a storage written on the host's device `host_id` arrives on here (None: no CUDA here)."""
    import torch

    cuda = _reader_device()
    if cuda is None:
        if not _warned_cpu[0]:
            _warned_cpu[0] = True
            warnings.warn(
                "fray: a CUDA tensor arrived in a process without CUDA: it is given on the CPU here (run this "
                "reader where a GPU is visible to get it on one)",
                RuntimeWarning,
                stacklevel=4,
            )
        return torch.device("cpu")
    ordinal = discover().ordinal(host_id)
    if ordinal is not None and ordinal < cuda.device_count():
        return torch.device("cuda", ordinal)
    return torch.device("cuda", cuda.current_device())


def _rebuild_staged(buf: Any, host_id: int) -> Any:
    import torch

    start = time.perf_counter()
    view = memoryview(buf)
    if current_borrows() is not None:  # get's copy into `out` uploads from the staged bytes themselves
        device_stats.record("cuda-staged-out", view.nbytes, time.perf_counter() - start)
        return _host_tensor(view).untyped_storage()
    target = _target(host_id)
    out = torch.empty(view.nbytes, dtype=torch.uint8, device=target)
    if view.nbytes:
        out.copy_(_host_tensor(view))
    device_stats.record("cuda-staged", view.nbytes, time.perf_counter() - start)
    return out.untyped_storage()


def _host_tensor(view: memoryview) -> Any:
    """The bytes of `view` as a CPU tensor over the same memory, to be read only."""
    import torch

    if not view.nbytes:  # (torch.frombuffer refuses an empty buffer)
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():  # a read-only buffer: torch warns that it is not writable; it is only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(view, dtype=torch.uint8)


def _rebuild_shared(ref: ShareRef) -> Any:
    """A storage shared by another process of this host, copied into this process's memory on the device the
    writer's maps to here (fray.runtime.device_shares)."""
    return rebuild_shared(ref, _target(ref.device if ref.device is not None else 0))


def _rebuild_kept(token: int, nbytes: int) -> Any:
    import torch

    start = time.perf_counter()
    with _kept_lock:
        found = _kept.get(token)
    if found is None:
        raise FrayError(
            "a CUDA tensor serialized for readers in its own process (in_memory) was read elsewhere, or after its "
            "value was freed: this is a bug in the backend that sent it; please report it"
        )
    kept, copied = found
    source = torch.empty(0, dtype=torch.uint8, device=kept.device).set_(kept)
    stream = torch.cuda.current_stream(kept.device)  # (the stream this copy runs on: its device's current one)
    stream.wait_event(copied)  # the kept copy is complete
    source.record_stream(stream)  # not reused while this stream reads it, even if the value is freed meanwhile
    if current_borrows() is not None:  # get's copy into `out` reads the kept copy itself, on this stream
        device_stats.record("cuda-device-copy-out", nbytes, time.perf_counter() - start)
        return kept
    copy = source.clone()
    device_stats.record("cuda-device-copy", nbytes, time.perf_counter() - start)
    return copy.untyped_storage()
