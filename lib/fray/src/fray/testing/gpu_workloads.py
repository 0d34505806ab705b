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
