"""Arguments on their way into Ray: fray refs become Ray refs, torch tensors are packed, a group call's large
arguments are put once.

Top-level fray ObjectRefs become their Ray refs, which Ray resolves to values before the task runs (fray's
contract: top-level refs arrive as values, nested ones as refs). Each function returns its input itself when it
has nothing to change, so a caller can tell "nothing converted" with `is` (and skip the cancel bookkeeping of
`_cancel`, which only matters for a task with ref arguments).
"""

from __future__ import annotations

from typing import Any

import ray

from fray.backend import STAGED, ObjectRef
from fray_ray._values import Packed, known_nbytes, pack_args, pack_kwargs

__all__ = [
    "SHARE_BYTES",
    "hold_shares",
    "is_serialization_error",
    "share_args",
    "share_kwargs",
    "unwrap_args",
    "unwrap_kwargs",
]

SHARE_BYTES = 100 * 1024  # a group call's argument at least this big is put once and read by every member


def unwrap_args(args: tuple[Any, ...], device_mode: str = STAGED) -> tuple[Any, ...]:
    """Top-level fray refs become Ray refs (Ray resolves them); arguments holding torch tensors are packed
    (device memory in `device_mode`: the caller then holds its shares with `hold_shares`)."""
    for arg in args:
        if type(arg) is ObjectRef:
            args = tuple(a.payload if type(a) is ObjectRef else a for a in args)
            break
    return pack_args(args, device_mode)


def unwrap_kwargs(kwargs: dict[str, Any], device_mode: str = STAGED) -> dict[str, Any]:
    for value in kwargs.values():
        if type(value) is ObjectRef:
            kwargs = {k: v.payload if type(v) is ObjectRef else v for k, v in kwargs.items()}
            break
    return pack_kwargs(kwargs, device_mode)


def hold_shares(ref: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The device snapshots that packed arguments refer to (fray.runtime.device_shares) stay served until the call
    behind `ref` is done: its reader has copied them by then (a retry included)."""
    tokens = [t for a in (*args, *kwargs.values()) if type(a) is Packed for t in a.blob.share_tokens()]
    if tokens:
        ref.future().add_done_callback(lambda _done, held=tokens: held.clear())


def _worth_sharing(value: Any) -> bool:
    if type(value) is Packed:
        return sum(memoryview(b).nbytes for b in value.blob.buffers) + len(value.blob.data) >= SHARE_BYTES
    return known_nbytes(value) >= SHARE_BYTES


def share_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A group call's large (already unwrapped) arguments put once: each member's call then reads that one
    object, as Ray resolves a top-level ref argument to its value."""
    if any(_worth_sharing(a) for a in args):
        return tuple(ray.put(a) if _worth_sharing(a) else a for a in args)
    return args


def share_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    if any(_worth_sharing(v) for v in kwargs.values()):
        return {k: ray.put(v) if _worth_sharing(v) else v for k, v in kwargs.items()}
    return kwargs


def is_serialization_error(exc: BaseException) -> bool:
    """Ray's submission failed because an argument does not pickle (Ray raises a TypeError saying so); the
    caller then names the argument with fray.runtime.serialization.find_unserializable_argument."""
    return isinstance(exc, TypeError) and "serialize" in str(exc)
