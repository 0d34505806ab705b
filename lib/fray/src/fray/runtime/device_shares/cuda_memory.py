"""CUDA device memory for the share protocol (fray.runtime.device_shares.memory.DeviceMemory).

- A snapshot is one flat copy of a storage's bytes on its device, made on the dumping thread's current stream
  after the storage's writers are done (the caller synchronizes the device: fray.runtime.cuda_values), with an
  interprocess event recorded after the copy.
- A share is torch's `_share_cuda_()` handle of the snapshot's storage, made anew for each reader (torch counts
  each handle's use once), and the event's IPC handle, with the device named by the host's id (fray.runtime.gpus): a
  reader numbers devices by its own CUDA_VISIBLE_DEVICES, and one that does not see the device stages.
- A reader opens the handle (`_new_shared_cuda`), waits for the event on its current stream, copies into memory
  of its own on the target device and drops the alias, so the producer's memory is never the reader's value.
  A handle this process cannot open (the device not visible here, another container, a MIG slice) is
  DeviceOpenError: the reader asks for staging.
- A get into the caller's own memory (fray.runtime.borrowing) borrows the opened snapshot instead of copying it:
  get's copy into `out` reads it on the same stream, and the lease goes back once that device is done with it.
- Staging: the producer copies the snapshot into pinned host memory (fray.runtime.pinned); the reader receives
  into pinned memory of its own and uploads from it (no pageable copy on either side).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fray.runtime.device_shares.memory import DeviceOpenError, Share
from fray.runtime.gpus import discover
from fray.runtime.pinned import cuda_pinned

__all__ = ["CudaMemory", "CudaSnapshot", "cuda_memory"]


@dataclass
class CudaSnapshot:
    storage: Any  # torch.UntypedStorage on the device
    event: Any  # torch.cuda.Event(interprocess=True), recorded after the copy


class CudaMemory:
    name = "cuda"

    def snapshot(self, source: Any) -> CudaSnapshot:
        import torch

        flat = torch.empty(0, dtype=torch.uint8, device=source.device).set_(source)
        with torch.cuda.device(source.device):
            copy = flat.clone()
            event = torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]  # (untyped in torch)
            event.record(torch.cuda.current_stream(source.device))
        return CudaSnapshot(copy.untyped_storage(), event)

    def nbytes(self, snapshot: Any) -> int:
        return int(snapshot.storage.nbytes())

    def share(self, snapshot: Any) -> Share:
        import torch

        device = snapshot.storage.device
        with torch.cuda.device(device):
            handle = snapshot.storage._share_cuda_()
            event = snapshot.event.ipc_handle()
        ids = discover().ids
        index = device.index or 0
        return Share((ids[index] if index < len(ids) else index, tuple(handle), event))

    def open_copy(self, share: Share, fds: list[int], where: Any) -> Any:
        import torch

        alias, target = self._open(share, where)
        with torch.cuda.device(target):
            source = torch.empty(0, dtype=torch.uint8, device=alias.device).set_(alias)
            out = torch.empty(source.numel(), dtype=torch.uint8, device=target)
            out.copy_(source)
            torch.cuda.current_stream(target).synchronize()  # the alias is dropped below: the copy must have read it
        del source, alias
        return out.untyped_storage()

    def open_alias(self, share: Share, fds: list[int], where: Any) -> tuple[Any, Callable[[], None]]:
        import torch

        alias, _ = self._open(share, where)
        device = alias.device

        def reads_done() -> None:
            # A copy out of it runs on its device's current stream, a copy to another device too (torch copies
            # between devices on the source's stream and syncs the destination's).
            torch.cuda.synchronize(device)

        return alias, reads_done

    def unopenable(self, device: int | None, where: Any) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return "this process has no CUDA device"
        ordinal = None if device is None else discover().ordinal(device)
        if ordinal is None or ordinal >= torch.cuda.device_count():
            return f"the host's device {device} is not visible in this process"
        if where is not None and torch.device(where).type != "cuda":
            return f"the value is read onto {where}"
        return None

    def _open(self, share: Share, where: Any) -> tuple[Any, Any]:
        """The snapshot's storage opened here, readable on this thread's current stream of the target device
        (after the producer's copy, by its event), and that target device."""
        import torch

        host_id, handle, event_handle = share.handle
        why_not = self.unopenable(host_id, where)
        if why_not is not None:
            _release_unopened(handle)
            raise DeviceOpenError(why_not)
        handle = (discover().ordinal(host_id), *handle[1:])  # (the producer's device as this process numbers it)
        target = where if where is not None else torch.device("cuda", torch.cuda.current_device())
        try:
            with torch.cuda.device(target):
                alias = torch.UntypedStorage._new_shared_cuda(*handle)  # type: ignore[attr-defined]
        except (RuntimeError, TypeError) as exc:  # (cudaErrorInvalidDevice, a handle from another container)
            _release_unopened(handle)
            raise DeviceOpenError(f"the share of a value on device {host_id} cannot be opened here: {exc}") from None
        try:
            with torch.cuda.device(target):
                event = torch.cuda.Event.from_ipc_handle(alias.device, event_handle)  # type: ignore[no-untyped-call]
        except (RuntimeError, TypeError) as exc:  # (the alias, dropped here, gives its share back itself)
            raise DeviceOpenError(f"the event of a value on device {host_id} cannot be opened here: {exc}") from None
        with torch.cuda.device(target):
            torch.cuda.current_stream(target).wait_event(event)
            if alias.device != target:  # (a copy from it runs on its own device's stream: that one waits too)
                torch.cuda.current_stream(alias.device).wait_event(event)
        return alias, target

    def stage(self, snapshot: Any) -> memoryview:
        import torch

        storage = snapshot.storage
        if not storage.nbytes():
            return memoryview(b"")
        pinned = cuda_pinned(storage.nbytes())
        with torch.cuda.device(storage.device):
            torch.cuda.current_stream(storage.device).wait_event(snapshot.event)
            source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            torch.frombuffer(pinned, dtype=torch.uint8).copy_(source)
        return pinned

    def host_buffer(self, nbytes: int) -> memoryview:
        import torch

        if not torch.cuda.is_available():
            return memoryview(bytearray(nbytes))
        return cuda_pinned(nbytes)

    def upload(self, data: memoryview, where: Any) -> Any:
        import torch

        target = where if where is not None else torch.device("cpu")
        host = torch.frombuffer(data, dtype=torch.uint8) if data.nbytes else torch.empty(0, dtype=torch.uint8)
        out = torch.empty(data.nbytes, dtype=torch.uint8, device=target)
        out.copy_(host)
        return out.untyped_storage()

    def free(self, snapshot: Any) -> None:
        snapshot.storage = None
        snapshot.event = None


cuda_memory = CudaMemory()


def _release_unopened(handle: tuple[Any, ...]) -> None:
    """Give back the producer's count of a share that will not be opened here: torch frees a shared snapshot once
    each of its shares is opened and dropped, or released this way (as torch.multiprocessing does for a share it
    already holds)."""
    import torch

    try:
        torch.UntypedStorage._release_ipc_counter_cuda(handle[4], handle[5])  # type: ignore[attr-defined]
    except (RuntimeError, TypeError, AttributeError, IndexError):  # (a torch without CUDA: nothing was counted here)
        pass
