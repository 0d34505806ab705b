"""What the CUDA tests (tests/gpu) run in tasks and actors: importable by every worker process."""

from __future__ import annotations

import os
from typing import Any

import fray


def make_on_gpu(n: int, value: float = 1.0) -> Any:
    import torch

    return torch.full((n,), value, device="cuda")


def describe(t: Any) -> tuple[str, float, int]:
    """(device type, sum, numel) of a tensor where it arrived."""
    return t.device.type, float(t.sum().item()), t.numel()


def assigned() -> dict[str, Any]:
    import torch

    return {
        "gpus": fray.current_gpus(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "count": torch.cuda.device_count(),
        "current": torch.cuda.current_device(),
    }


def allocated() -> int:
    import torch

    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


class Holder:
    def __init__(self) -> None:
        self.value: Any = None

    def keep(self, t: Any) -> tuple[str, float]:
        self.value = t
        return t.device.type, float(t.sum().item())

    def make(self, n: int) -> Any:
        import torch

        return torch.ones(n, device="cuda")


def made_on_side_stream(n: int, value: float, cycles: int) -> Any:
    """A tensor of `n` `value`s written on a side stream after `cycles` of device sleep, returned while that stream
    may still be running (no synchronize: fray's dump must wait for it)."""
    import torch

    cuda: Any = torch.cuda  # (Stream and _sleep are untyped in torch)
    out = torch.zeros(n, device="cuda")
    side = cuda.Stream()
    side.wait_stream(cuda.current_stream())  # (out's zeros first)
    with cuda.stream(side):
        cuda._sleep(cycles)
        out.fill_(value)
    out.record_stream(side)
    return out


class CudaMember:
    """An SPMD member given a CUDA tensor in its constructor: it makes LOCAL_RANK's device current, as under
    torchrun, after the tensor was unpickled."""

    def __init__(self, t: Any) -> None:
        import torch

        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        self.seen = (os.environ.get("CUDA_VISIBLE_DEVICES"), local_rank, float(t.sum().item()))

    def where(self) -> tuple[str | None, int, float, list[int]]:
        """(CUDA_VISIBLE_DEVICES, LOCAL_RANK, the argument's sum) at __init__, and fray.current_gpus()."""
        return (*self.seen, fray.current_gpus())
