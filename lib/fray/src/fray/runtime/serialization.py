"""Serialization shared by the backends: values, arguments and remote exceptions.

One path for every backend: pickle protocol 5 with out-of-band buffers. Large binary data never goes into the
pickle stream itself: numpy arrays (their own protocol-5 reducer), torch tensors (fray's reducer below, not
torch's in-band storage pickling; CUDA storages: fray.runtime.cuda_values), memoryviews, and bytes/bytearrays above
OOB_THRESHOLD travel as buffers beside a small in-band part, so a store can place them in shared memory and a
reader can map them.

The torch reducer is installed through the pickler's own `reducer_override`, never through `copyreg`, so
pickling elsewhere in the user's process is unchanged. Functions and classes defined in `__main__`, a notebook
or a test module travel by value (cloudpickle).

Reading back: buffers handed to `loads` are used in place. numpy arrays over a read-only buffer come back
read-only (writing raises, as with Ray). torch has no read-only tensors, so a tensor's storage is used in place
only when its buffer is writable and private to this reader (a copy-on-write mapping); otherwise it is copied
once. `Blob.private` lists the buffers that want such a private mapping.
"""

from __future__ import annotations

import ctypes
import io
import pickle
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from fray.errors import FrayError, SerializationError
from fray.runtime.cuda_values import STAGED, CudaStorage, KeptToken
from fray.runtime.device_shares import MemfdBuffer, ShareToken, reduce_memfd_buffer
from fray.runtime.pool import pool_copy
from fray.runtime.remote_errors import RemoteError, capture_exception

__all__ = [
    "OOB_THRESHOLD",
    "Blob",
    "RemoteError",
    "capture_exception",
    "dumps",
    "dumps_call",
    "find_unserializable_argument",
    "loads",
    "loads_data",
    "plain_pickle",
]

# bytes / bytearray at least this large travel out of band. Below it a buffer's bookkeeping costs more than
# the copy it saves (.agents/measured.md).
OOB_THRESHOLD = 64 * 1024
_SCAN_LIMIT = 256  # containers scanned for large bytes: up to this many items, two levels deep

_local = threading.local()
_LIFETIME_TOKENS = (KeptToken, ShareToken)  # what a serialized value keeps for as long as it lives


@dataclass
class Blob:
    """A serialized value: in-band bytes, out-of-band buffers, and the refs it contains (kept alive with it).

    `buffers` are owned copies (bytes, or read-only views of pooled memory for large ones: fray.runtime.pool) or
    memoryviews over the live source object (`dumps(copy=False)`: valid
    only while the Blob lives, to be written out at once). `private` holds the indices of buffers that a reader
    must get writable and private (torch storages), e.g. through a copy-on-write mapping."""

    data: bytes
    buffers: list[Any] = field(default_factory=list)
    contained: list[Any] = field(default_factory=list)
    private: frozenset[int] = frozenset()
    keep: list[Any] = field(default_factory=list, repr=False)  # sources of uncopied buffers

    @property
    def nbytes(self) -> int:
        return len(self.data) + sum(memoryview(b).nbytes for b in self.buffers)

    def share_tokens(self) -> list[Any]:
        """What keeps this value's device snapshots served (fray.runtime.device_shares): its keeper keeps these."""
        return [k for k in self.keep if type(k) is ShareToken]


def note_contained(obj: Any) -> None:
    """Called from a payload's __reduce__ while `dumps` runs, so the Blob keeps that object alive."""
    contained = getattr(_local, "contained", None)
    if contained is not None:
        contained.append(obj)


# --------------------------------------------------------------------------------------- out-of-band reducers
class _OobBytes:
    """Stands in for a large bytes/bytearray so that the C pickler (which writes those in-band without asking
    reducer_override) sends its contents out of band."""

    __slots__ = ("value",)

    def __init__(self, value: bytes | bytearray) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        kind = bytearray if type(self.value) is bytearray else bytes
        return (_rebuild_bytes, (kind, pickle.PickleBuffer(self.value)))


def _rebuild_bytes(kind: type[bytes] | type[bytearray], buf: Any) -> bytes | bytearray:
    return kind(buf)  # bytes and bytearray own their memory: one copy


def _rebuild_memoryview(buf: Any, fmt: str, shape: tuple[int, ...]) -> memoryview:
    view = memoryview(buf)
    if view.format != fmt or view.shape != shape:
        view = view.cast("B").cast(fmt, shape)  # type: ignore[call-overload]
    return view.toreadonly()


def _substitute_large_bytes(obj: Any, depth: int = 0) -> Any:
    """obj with large bytes/bytearrays (top level, or in lists, tuples and dicts two levels down) wrapped."""
    t = type(obj)
    if t is bytes or t is bytearray:
        return _OobBytes(obj) if len(obj) >= OOB_THRESHOLD else obj
    if depth >= 2 or t not in (list, tuple, dict) or len(obj) > _SCAN_LIMIT:
        return obj
    if t is dict:
        items = {k: _substitute_large_bytes(v, depth + 1) for k, v in obj.items()}
        return items if any(items[k] is not v for k, v in obj.items()) else obj
    new = [_substitute_large_bytes(v, depth + 1) for v in obj]
    if all(a is b for a, b in zip(new, obj, strict=True)):
        return obj
    return new if t is list else tuple(new)


class _Storage:
    """One torch storage inside one dump: pickled once, so views sharing it share it again when loaded."""

    __slots__ = ("pickler", "storage")

    def __init__(self, storage: Any, pickler: Any) -> None:  # pickler: None once its dump is done
        self.storage = storage
        self.pickler = pickler

    def __reduce__(self) -> tuple[Any, ...]:
        n = self.storage.nbytes()
        if n == 0:
            return (_rebuild_storage, (b"",))
        raw = (ctypes.c_ubyte * n).from_address(self.storage.data_ptr())
        raw.storage = self.storage  # type: ignore[attr-defined]  # the buffer keeps its storage alive
        buf = pickle.PickleBuffer(raw)
        self.pickler.private_ids.add(id(buf))
        self.pickler.keep.append(buf)
        return (_rebuild_storage, (buf,))


def _rebuild_storage(buf: Any) -> Any:
    import torch

    view = memoryview(buf)
    if view.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8).untyped_storage()
    if view.readonly:  # shared with other readers: this reader gets its own copy (pooled memory: warm pages)
        return torch.frombuffer(pool_copy(view, readonly=False), dtype=torch.uint8).untyped_storage()
    return torch.frombuffer(view, dtype=torch.uint8).untyped_storage()  # private and writable: used in place


def _rebuild_tensor(
    storage: Any, dtype: str, offset: int, size: tuple[int, ...], stride: tuple[int, ...], grad: bool, param: bool
) -> Any:
    import torch

    tensor = torch.empty(0, dtype=getattr(torch, dtype), device=storage.device).set_(storage, offset, size, stride)
    if param:
        return torch.nn.Parameter(tensor, requires_grad=grad)
    return tensor.requires_grad_(grad) if grad else tensor


def _tensor_types() -> tuple[type, ...]:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor") or not hasattr(torch, "nn"):
        return ()
    return (torch.Tensor, torch.nn.Parameter)


def _reduce_tensor(t: Any, pickler: Any) -> Any:
    """fray's reducer for a dense CPU or CUDA tensor (plain or Parameter; CUDA storages: fray.runtime.cuda_values);
    NotImplemented leaves others to torch (other devices, sparse, quantized, conjugate views, subclasses)."""
    import torch

    if (
        t.device.type not in ("cpu", "cuda")
        or t.layout != torch.strided
        or t.is_quantized
        or t.is_nested
        or t.is_conj()
        or t.is_neg()
        or (t.grad_fn is not None)  # a non-leaf: torch refuses to pickle it, say so the same way
    ):
        return NotImplemented
    storage = t.untyped_storage()
    key = (storage.data_ptr(), storage.nbytes())
    box = pickler.storages.get(key)
    if box is None:
        kind = _Storage if t.device.type == "cpu" else CudaStorage
        box = pickler.storages[key] = kind(storage, pickler)
    dtype = str(t.dtype).rsplit(".", 1)[-1]
    args = (box, dtype, t.storage_offset(), tuple(t.size()), tuple(t.stride()), t.requires_grad)
    return (_rebuild_tensor, (*args, type(t) is torch.nn.Parameter))


class _Reducers:
    """The reducer_override shared by fray's two picklers (C pickle first, cloudpickle as fallback)."""

    storages: dict[tuple[int, int], _Storage | CudaStorage]
    private_ids: set[int]
    keep: list[Any]
    device_mode: str = STAGED  # how CUDA storages travel (fray.runtime.cuda_values): set by dumps

    def _setup(self) -> None:
        self.storages = {}
        self.private_ids = set()
        self.keep = []
        self.tensors = _tensor_types()

    def _fray_reduce(self, obj: Any) -> Any:
        t = type(obj)
        if t is memoryview:
            fmt, shape = obj.format, obj.shape or ()
            return (_rebuild_memoryview, (pickle.PickleBuffer(obj), fmt, shape))
        if self.tensors and t in self.tensors:
            return _reduce_tensor(obj, self)
        if t is MemfdBuffer:
            return reduce_memfd_buffer(obj, self.device_mode, self.keep)
        return NotImplemented


class _Pickler(_Reducers, pickle.Pickler):
    def __init__(self, file: Any, buffer_callback: Callable[[Any], None]) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self._setup()

    def reducer_override(self, obj: Any) -> Any:
        return self._fray_reduce(obj)


class _CloudPickler(_Reducers, cloudpickle.Pickler):  # type: ignore[misc]
    def __init__(self, file: Any, buffer_callback: Callable[[Any], None]) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self._setup()

    def reducer_override(self, obj: Any) -> Any:
        reduced = self._fray_reduce(obj)
        return super().reducer_override(obj) if reduced is NotImplemented else reduced


def _pickle_with(
    cls: type, obj: Any, buffers: list[pickle.PickleBuffer], device_mode: str = STAGED
) -> tuple[bytes, Any]:
    out = io.BytesIO()
    pickler = cls(out, buffers.append)
    pickler.device_mode = device_mode
    try:
        pickler.dump(obj)
    finally:
        # pickler.storages -> _Storage -> pickler is a cycle: left alone, every tensor pickled stays alive until
        # the cyclic GC runs, which a loop of few large tensors rarely triggers (a trainer's memory would grow every
        # step, and its allocations land on fresh pages).
        for box in pickler.storages.values():
            box.pickler = None
        pickler.storages.clear()
    return out.getvalue(), pickler


# Values that hold no refs, buffers or tensors: pickled by the plain C pickler, without a Pickler object of
# fray's own, whose setup costs several times the pickling of a small value (a group call pays it once for each
# member, in that member's process, and every call's (args, kwargs) once).
_SCALARS = frozenset({int, float, bool, complex, str, type(None)})
_PLAIN_ITEMS = 16  # containers up to this many items, two levels deep, are checked for plainness


def _plain(obj: Any, depth: int = 0) -> bool:
    """obj is a scalar, small bytes, or a small tuple/list/dict of such (two levels): nothing fray's pickler
    would treat specially. (Loops rather than all() over generators: this runs for every call's arguments, and
    the generator frames would be most of its cost.)"""
    t = type(obj)
    if t in _SCALARS:
        return True
    if t is bytes:
        return len(obj) < OOB_THRESHOLD
    if (t is not tuple and t is not list and t is not dict) or depth >= 2 or len(obj) > _PLAIN_ITEMS:
        return False
    if t is dict:
        for k, v in obj.items():
            if type(k) not in _SCALARS or (type(v) not in _SCALARS and not _plain(v, depth + 1)):
                return False
        return True
    for v in obj:  # noqa: SIM110 (a loop: all() over a generator would be most of its cost)
        if type(v) not in _SCALARS and not _plain(v, depth + 1):
            return False
    return True


def plain_pickle(obj: Any) -> bytes | None:
    """obj's pickle when it is plain (what dumps would make of it: no refs, buffers or tensors inside), else None."""
    return pickle.dumps(obj, protocol=5) if _plain(obj) else None


def dumps(obj: Any, what: str = "value", copy: bool = True, device_mode: str = STAGED) -> Blob:
    """Serialize obj. Raises SerializationError (naming `what`) if it cannot be pickled.

    copy=True: each out-of-band buffer is copied once (as an object store does), so later mutation of obj
    cannot change the stored value. copy=False: buffers are views of obj's own memory, for a caller that
    writes them out (to shared memory, a socket) before obj can change. device_mode: how CUDA tensors travel
    (fray.runtime.cuda_values): STAGED through pinned host memory for a reader in another process, KEPT as device
    copies for readers in this one."""
    plain = plain_pickle(obj)
    if plain is not None:
        return Blob(plain)
    buffers: list[pickle.PickleBuffer] = []
    outer = getattr(_local, "contained", None)  # dumps may nest (a payload's __reduce__ pickling more)
    contained: list[Any] = []
    _local.contained = contained
    value = _substitute_large_bytes(obj)
    try:
        try:  # the C pickler is several times faster; cloudpickle handles what it cannot (lambdas, local functions...)
            data, pickler = _pickle_with(_Pickler, value, buffers, device_mode)
            if b"__main__" in data:  # pickled by reference to __main__: another process could not load it
                raise pickle.PicklingError("refers to __main__")
        except Exception:
            buffers.clear()
            contained.clear()
            data, pickler = _pickle_with(_CloudPickler, value, buffers, device_mode)
    except Exception as exc:
        raise SerializationError(f"cannot serialize {what} of type {type(obj).__name__}: {exc}") from exc
    finally:
        _local.contained = outer
    private = frozenset(i for i, b in enumerate(buffers) if id(b) in pickler.private_ids)
    kept = [k for k in pickler.keep if type(k) in _LIFETIME_TOKENS]  # device copies and shares live as the value
    if not buffers:
        return Blob(data, [], contained, keep=kept)
    if copy:  # large buffers are copied into pooled memory: a fresh allocation would cost more than the copy
        return Blob(data, [pool_copy(b.raw(), readonly=True) for b in buffers], contained, private, keep=kept)
    return Blob(data, [b.raw() for b in buffers], contained, private, keep=[*buffers, *pickler.keep])


def loads(blob: Blob, what: str = "a value") -> Any:
    """Rebuild a value. Raises SerializationError naming `what` (with the cause chained) if it cannot be
    unpickled here: a class that does not import, a __setstate__ that raises..."""
    return loads_data(blob.data, blob.buffers, what)


def loads_data(data: bytes, buffers: Sequence[Any] = (), what: str = "a value") -> Any:
    """loads of a value's in-band bytes and buffers, without a Blob around them (a small value in a message)."""
    try:
        return _loads_past_import_races(data, buffers)
    except FrayError:  # fray's own (a ref to a freed object...): already says what is wrong
        raise
    except Exception as exc:
        raise SerializationError(
            f"cannot deserialize {what} where it arrived: {type(exc).__name__}: {exc}. It was pickled where it "
            "was made; the receiving process must be able to rebuild it (same modules and versions installed)."
        ) from exc


# Pauses before loading again after an ImportError other than a missing module (see _loads_past_import_races).
IMPORT_RACE_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8)


def _loads_past_import_races(data: bytes, buffers: Sequence[Any]) -> Any:
    """pickle.loads, again after an ImportError that is not a missing module: threads of one worker that load
    values of a package none has imported yet race in its imports, and one can see it half initialized
    ("cannot import name 'array' from 'dask'" on a worker running several tasks in threads). Once the other
    thread's import is done, the same bytes load."""
    for pause in IMPORT_RACE_PAUSES:
        try:
            return pickle.loads(data, buffers=buffers)
        except ModuleNotFoundError:
            raise
        except ImportError:
            time.sleep(pause)
    return pickle.loads(data, buffers=buffers)


def dumps_call(where: str, args: Sequence[Any], kwargs: Mapping[str, Any], device_mode: str = STAGED) -> Blob:
    """Serialize a call's (args, kwargs); on failure the SerializationError names the argument at fault."""
    try:
        return dumps((tuple(args), dict(kwargs)), f"the arguments of {where}", device_mode=device_mode)
    except SerializationError as exc:
        raise find_unserializable_argument(where, args, kwargs, exc.__cause__) from exc.__cause__


def find_unserializable_argument(
    fn_name: str, args: Sequence[Any], kwargs: Mapping[str, Any], cause: BaseException | None = None
) -> SerializationError:
    """Build a SerializationError that names which argument of `fn_name` could not be pickled."""
    for position, value in enumerate(args):
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            return SerializationError(
                f"argument {position} of {fn_name} ({type(value).__name__}) cannot be serialized: {exc}. "
                "Arguments travel to another process; pass something picklable (or create it inside the task)."
            )
    for key, value in kwargs.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            return SerializationError(
                f"keyword argument {key!r} of {fn_name} ({type(value).__name__}) cannot be serialized: {exc}. "
                "Arguments travel to another process; pass something picklable (or create it inside the task)."
            )
    return SerializationError(f"the arguments of {fn_name} cannot be serialized: {cause}")


def check_function(fn: Callable[..., Any], checked: dict[int, Any]) -> None:
    """Check once per function that it can travel to a worker (closures over locks, sockets... cannot).

    The cache holds a function weakly where it can: a bound method or a closure passed once must not live on
    (with its object) for as long as the context does."""
    key = id(fn)
    known = checked.get(key)
    if known is fn or (isinstance(known, weakref.ref) and known() is fn):
        return
    try:
        cloudpickle.dumps(fn)
    except Exception as exc:
        raise unpicklable_code(fn, exc) from exc
    try:
        checked[key] = weakref.ref(fn, lambda _: checked.pop(key, None))
    except TypeError:  # a builtin or an object without weak references: kept (they are long-lived)
        checked[key] = fn


def unpicklable_code(fn: Any, exc: BaseException) -> SerializationError:
    """The error for a task function or actor class that cannot travel: what it probably captures, and the fix."""
    name = getattr(fn, "__qualname__", repr(fn))
    return SerializationError(
        f"{name} cannot be serialized to run remotely: {exc}. It probably captures an unpicklable object "
        "(a lock, a socket, an open file, a client); create that object inside the function instead."
    )


def dumps_code(fn: Any, what: str) -> Blob:
    """dumps of a task function or actor class (`what` names it): a failure says what it probably captures."""
    try:
        return dumps(fn, what)
    except SerializationError as exc:
        cause = exc.__cause__ or exc
        raise unpicklable_code(fn, cause) from cause
