"""How a stand-in device value (MemfdBuffer) is serialized, in each of fray's device modes (fray.runtime.cuda_values
names them): `kept` and `staged` carry its bytes (a reader in this process; one in a process that may be on
another host), `shared` carries a share of a snapshot its producer serves (a reader in another process of
this host: fray.runtime.device_shares.producer). CUDA storages take the same three ways in fray.runtime.cuda_values; the
modes' one home is here."""

from __future__ import annotations

import pickle
from typing import Any

from fray.runtime.device_shares.memory import MemfdBuffer, memfd_memory
from fray.runtime.device_shares.producer import publish
from fray.runtime.device_shares.reader import rebuild_shared
from fray.runtime.device_shares.wire import ShareRef

__all__ = ["KEPT", "SHARED", "STAGED", "reduce_memfd_buffer"]

KEPT = "kept"  # every reader is in this process
STAGED = "staged"  # a reader may be in another process, on another host: the bytes travel with the value
SHARED = "shared"  # every reader is in another process of this host: a share of a snapshot travels


def reduce_memfd_buffer(buf: MemfdBuffer, device_mode: str, keep: list[Any]) -> tuple[Any, ...]:
    """The reduction of `buf` for a pickler in `device_mode`; what the serialized value must keep goes in `keep`."""
    if device_mode == SHARED:
        ref, token = publish(memfd_memory, buf, None)
        keep.append(token)
        return (_rebuild_memfd_shared, (ref,))
    return (_rebuild_memfd_bytes, (pickle.PickleBuffer(bytearray(buf.tobytes())),))


def _rebuild_memfd_shared(ref: ShareRef) -> MemfdBuffer:
    value = rebuild_shared(ref)
    assert isinstance(value, MemfdBuffer)
    return value


def _rebuild_memfd_bytes(data: Any) -> MemfdBuffer:
    return MemfdBuffer(memoryview(data))
