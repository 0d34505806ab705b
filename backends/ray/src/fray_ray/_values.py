"""Values on their way into Ray: torch CPU tensors travel out of band, through fray's serializer.

Ray pickles a torch tensor in-band (its storage bytes inside the pickle stream, slowly, and a second
copy on the way out). Fray's serializer (`fray.runtime.serialization.dumps(copy=False)`) instead turns every tensor
storage, numpy array and large bytes into an out-of-band buffer. A value that holds torch tensors is therefore
handed to Ray as a `Packed` object whose `__reduce__` returns those buffers as `pickle.PickleBuffer`s: Ray's own
pickle-5 serializer writes them into the object store with one memcpy, and a reader gets them back as read-only
memoryviews over shared memory. `unpack` (called by pickle on the reader's side) copies each torch storage's
buffer once into memory of the reader's own (torch has no read-only tensors, and a writable view of shared
memory would let one reader's writes reach every other reader) and hands it to `fray.runtime.serialization.loads`,
which then uses it in place; numpy arrays stay zero-copy read-only views.

That one copy goes into memory allocated by numpy, which asks the kernel for transparent huge pages: a large
copy there is several times faster than one into bytearray / torch.empty memory (4 KiB page faults).

Nothing is registered with Ray (no `register_serializer`, no `copyreg`): raw Ray in the same process keeps its
own behaviour, and only values going through fray-ray are packed.

What is packed: a torch tensor, bytearray or memoryview, or a list / tuple / dict holding one within two
levels. (Ray itself turns bytearrays into bytes and cannot pickle memoryviews; fray gives them back as they
were: a bytearray, a read-only memoryview.) Values holding Ray or fray refs or actor handles are never packed:
Ray must see those while it serializes (its reference counting). They are looked for among the same items
before pickling, and anywhere in the pickled stream after it (their classes' names), so a ref nested deeper
also keeps Ray's path.
"""

from __future__ import annotations

import pickle
import sys
import threading
from typing import Any

from fray.backend import STAGED, Blob, MemfdBuffer, dumps, loads

__all__ = ["Packed", "known_nbytes", "pack", "pack_args", "pack_kwargs", "take_unpacked_bytes", "unpack"]

_SCAN_LIMIT = 256  # items of a list / tuple / dict looked at for tensors
# Names that appear in a pickle stream holding a Ray ObjectRef (class ray.ObjectRef, also ObjectRefGenerator),
# anything else of ray._raylet, a Ray actor handle (ray.actor) or a fray ref / handle (fray.runtime.refs): such a value
# must go through Ray's own serializer. A false match only means the value takes Ray's (slower) path.
_REF_MARKERS = (b"ObjectRef", b"ray._raylet", b"ray.actor", b"fray.runtime.refs")
_REF_MODULES = frozenset({"ray", "ray._raylet", "ray.actor", "fray.runtime.refs"})

_local = threading.local()


class Packed:
    """A value serialized by fray, handed to Ray: in-band bytes plus out-of-band buffers."""

    __slots__ = ("blob",)

    def __init__(self, blob: Blob) -> None:
        self.blob = blob  # its buffers are views of the source value's memory (valid while blob lives)

    def __reduce__(self) -> tuple[Any, ...]:
        blob = self.blob
        private = tuple(sorted(blob.private))  # the buffers that are torch storages
        return (unpack, (blob.data, private, *[pickle.PickleBuffer(b) for b in blob.buffers]))


def unpack(data: bytes, private: tuple[int, ...], *buffers: Any) -> Any:
    """Rebuild a packed value. Whatever Ray hands over may be shared with other readers of the same object, so
    every buffer is read-only here (numpy arrays come back as read-only views) except torch storages, which
    get a private copy each (see the module doc)."""
    views = [memoryview(b).toreadonly() for b in buffers]
    if views:
        _local.unpacked = getattr(_local, "unpacked", 0) + sum(v.nbytes for v in views)
    for i in private:
        views[i] = _private_copy(views[i])
    return loads(Blob(data, views))


def _private_copy(view: memoryview) -> memoryview:
    """A writable copy of view that only this reader holds."""
    try:
        import numpy as np
    except ImportError:  # loads copies a read-only storage buffer itself (slower: 4 KiB page faults)
        return view
    out = np.empty(view.nbytes, dtype=np.uint8)
    np.copyto(out, np.frombuffer(view, dtype=np.uint8))
    return memoryview(out)  # type: ignore[arg-type]  # ndarray exports the buffer protocol


def take_unpacked_bytes() -> int:
    """Bytes of out-of-band buffers unpacked by this thread since the last call (for transfer stats)."""
    n: int = getattr(_local, "unpacked", 0)
    if n:
        _local.unpacked = 0
    return n


def known_nbytes(value: Any) -> int:
    """The size of a value Ray returned as is, where it is known without a walk (numpy, bytes), else 0."""
    nbytes = getattr(value, "nbytes", None)  # numpy arrays (read-only views of the object store)
    if type(nbytes) is int and type(value).__module__ == "numpy":
        return nbytes
    if type(value) in (bytes, bytearray, memoryview):
        return len(memoryview(value).cast("B"))
    return 0


_PLAIN_KINDS: tuple[type, ...] = (bytearray, memoryview, MemfdBuffer)
_kinds_with_torch: tuple[type, ...] | None = None


def _kinds() -> tuple[type, ...]:
    """The types whose presence makes a value worth packing: torch.Tensor (once torch is imported; never
    import it ourselves: no tensors exist without it), bytearray, memoryview, and the CPU stand-in of device
    memory (fray.runtime.device_shares.MemfdBuffer: it travels as CUDA tensors do)."""
    global _kinds_with_torch
    if _kinds_with_torch is None:
        tensor = getattr(sys.modules.get("torch"), "Tensor", None)
        if not isinstance(tensor, type):
            return _PLAIN_KINDS
        _kinds_with_torch = (tensor, *_PLAIN_KINDS)
    return _kinds_with_torch


def _is_ref(value: Any) -> bool:
    return type(value).__module__ in _REF_MODULES


def _worth_packing(value: Any, kinds: tuple[type, ...]) -> bool:
    """True if value is, or holds within two container levels (at most _SCAN_LIMIT items looked at), one of
    `kinds`, and no ref or actor handle shows up among the items looked at."""
    if isinstance(value, kinds):
        return True
    if not isinstance(value, (list, tuple, dict)):
        return False
    found = False
    budget = _SCAN_LIMIT
    level = [value]
    for _ in range(2):
        below: list[Any] = []
        for container in level:
            for item in container.values() if isinstance(container, dict) else container:
                budget -= 1
                if budget < 0:
                    return found
                if isinstance(item, kinds):
                    found = True
                elif isinstance(item, (list, tuple, dict)):
                    below.append(item)
                elif _is_ref(item):
                    return False
        level = below
    return found


def pack(value: Any, kinds: tuple[type, ...] | None = None, device_mode: str = STAGED) -> Any:
    """value itself, or a Packed standing in for it when it holds torch tensors, bytearrays, memoryviews or
    device values (see the module doc; device memory travels in `device_mode`: fray.runtime.device_shares)."""
    if not _worth_packing(value, kinds or _kinds()):
        return value
    try:
        blob = dumps(value, "a value", copy=False, device_mode=device_mode)
    except Exception:
        return value  # let Ray try (and report) it the way it always does
    if blob.contained or any(marker in blob.data for marker in _REF_MARKERS):
        return value
    return Packed(blob)


def pack_args(args: tuple[Any, ...], device_mode: str = STAGED) -> tuple[Any, ...]:
    """args with each argument worth packing packed; the same tuple when none is."""
    kinds = _kinds()
    for arg in args:
        if _worth_packing(arg, kinds):
            return tuple(pack(a, kinds, device_mode) for a in args)
    return args


def pack_kwargs(kwargs: dict[str, Any], device_mode: str = STAGED) -> dict[str, Any]:
    if not kwargs:
        return kwargs
    kinds = _kinds()
    for value in kwargs.values():
        if _worth_packing(value, kinds):
            return {k: pack(v, kinds, device_mode) for k, v in kwargs.items()}
    return kwargs
