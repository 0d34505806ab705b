"""`ctx.get(ref, out=...)`: a value received into tensors and arrays the caller already owns, as Ray's
`set_target_for_ref` and Monarch's `RDMABuffer.read_into` do: an RL rollout worker refreshes its weights into the
same `state_dict` every step instead of holding a fresh copy.

`out` has the value's shape: a torch tensor or a writable numpy array for each tensor or array of the value, inside
the same dicts (the same keys), lists and tuples (the same lengths). Everything is checked before anything is
written (a mismatch is a ValueError naming where it is and what differs), then each leaf is copied in place
(`Tensor.copy_`, across devices where they differ; `numpy.copyto`). Other leaves (numbers, strings, None) must be
equal in both, and are left alone.

The value is loaded for this copy alone: its device values are borrowed, not copied on the way
(fray.runtime.borrowing), and `receive` lets go of them once the copies are done.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from fray.runtime.borrowing import borrowing
from fray.runtime.device_shares.memory import MemfdBuffer

__all__ = ["receive", "receive_into"]


def receive(out: Any, load: Callable[[], Any]) -> Any:
    """`load()` (a get of the value) copied into `out`, its device values borrowed while it is (module doc)."""
    with borrowing():
        return receive_into(out, load())


def receive_into(out: Any, value: Any, what: str = "out") -> Any:
    """Copy `value` into `out` (see the module doc); returns `out`."""
    copies: list[Callable[[], None]] = []
    _plan(out, value, what, copies)
    for copy in copies:
        copy()
    return out


def _plan(out: Any, value: Any, where: str, copies: list[Callable[[], None]]) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{where} is a tensor, but the value there is a {type(value).__name__}")
        if tuple(out.shape) != tuple(value.shape) or out.dtype != value.dtype:
            raise ValueError(
                f"{where} is a {out.dtype} tensor of shape {tuple(out.shape)}, but the value there is a {value.dtype} "
                f"tensor of shape {tuple(value.shape)}: give a tensor of the value's shape and dtype"
            )
        copies.append(lambda: _copy_tensor(torch, out, value))
        return
    if isinstance(out, MemfdBuffer):  # (the CPU stand-in of a device tensor: it receives as one does)
        if not isinstance(value, MemfdBuffer) or value.nbytes != out.nbytes:
            raise ValueError(f"{where} is a MemfdBuffer of {out.nbytes} bytes, but the value there is {value!r}")
        copies.append(lambda: out.copy_from(value))
        return
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(out, numpy.ndarray):
        if not isinstance(value, numpy.ndarray):
            raise ValueError(f"{where} is a numpy array, but the value there is a {type(value).__name__}")
        if out.shape != value.shape or out.dtype != value.dtype:
            raise ValueError(
                f"{where} is a {out.dtype} array of shape {out.shape}, but the value there is a {value.dtype} array "
                f"of shape {value.shape}: give an array of the value's shape and dtype"
            )
        if not out.flags.writeable:
            raise ValueError(f"{where} is a read-only numpy array: give one that can be written")
        copies.append(lambda: numpy.copyto(out, value))
        return
    if isinstance(out, Mapping):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} is a {type(out).__name__}, but the value there is a {type(value).__name__}")
        if set(out) != set(value):
            missing = ", ".join(sorted(map(repr, set(value) - set(out)))[:5]) or "none"
            extra = ", ".join(sorted(map(repr, set(out) - set(value)))[:5]) or "none"
            raise ValueError(f"{where} does not have the value's keys: missing {missing}; not in the value: {extra}")
        for key in value:
            _plan(out[key], value[key], f"{where}[{key!r}]", copies)
        return
    if isinstance(out, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(out) != len(value):
            size = f"of {len(value)} items" if isinstance(value, (list, tuple)) else type(value).__name__
            raise ValueError(f"{where} has {len(out)} items, but the value there is {size}")
        for i, (o, v) in enumerate(zip(out, value, strict=True)):
            _plan(o, v, f"{where}[{i}]", copies)
        return
    if out != value:
        raise ValueError(
            f"{where} is {out!r}, but the value there is {value!r}: only tensors and numpy arrays (inside dicts, "
            "lists and tuples) receive a value; other items must be equal"
        )


def _copy_tensor(torch: Any, out: Any, value: Any) -> None:
    with torch.no_grad():  # (a Parameter that requires grad is written in place, as an optimizer step writes it)
        out.copy_(value)
