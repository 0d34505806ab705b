"""Serialization shared by the backends: values, arguments and remote exceptions.

Values are pickled with protocol 5 and out-of-band buffers (so numpy arrays and similar are copied once and
can be read back zero-copy), by cloudpickle, so functions and classes defined in `__main__`, a notebook or a
test module travel by value.
"""

from __future__ import annotations

import pickle
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from fray.errors import RemoteExceptionProxy, SerializationError, attach_remote_traceback

__all__ = [
    "Blob",
    "RemoteError",
    "capture_exception",
    "dumps",
    "dumps_call",
    "find_unserializable_argument",
    "loads",
]

_local = threading.local()


@dataclass
class Blob:
    """A serialized value: in-band bytes, out-of-band buffers, and the refs it contains (kept alive with it)."""

    data: bytes
    buffers: list[bytes] = field(default_factory=list)
    contained: list[Any] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return len(self.data) + sum(len(b) for b in self.buffers)


def note_contained(obj: Any) -> None:
    """Called from a payload's __reduce__ while `dumps` runs, so the Blob keeps that object alive."""
    contained = getattr(_local, "contained", None)
    if contained is not None:
        contained.append(obj)


def dumps(obj: Any, what: str = "value") -> Blob:
    """Serialize obj. Raises SerializationError (naming `what`) if it cannot be pickled."""
    buffers: list[pickle.PickleBuffer] = []
    outer = getattr(_local, "contained", None)  # dumps may nest (a payload's __reduce__ pickling more)
    contained: list[Any] = []
    _local.contained = contained
    try:
        try:  # the C pickler is ~6x faster; cloudpickle handles what it cannot (lambdas, local functions...)
            data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
            if b"__main__" in data:  # pickled by reference to __main__: another process could not load it
                raise pickle.PicklingError("refers to __main__")
        except Exception:
            buffers.clear()
            contained.clear()
            data = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    except Exception as exc:
        raise SerializationError(f"cannot serialize {what} of type {type(obj).__name__}: {exc}") from exc
    finally:
        _local.contained = outer
    # Copy each buffer once (as an object store does), so later mutation of obj cannot change the stored value,
    # and readers get read-only views of this copy.
    return Blob(data, [bytes(b.raw()) for b in buffers] if buffers else [], contained)


def loads(blob: Blob) -> Any:
    return pickle.loads(blob.data, buffers=blob.buffers)


def dumps_call(where: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Blob:
    """Serialize a call's (args, kwargs); on failure the SerializationError names the argument at fault."""
    try:
        return dumps((tuple(args), dict(kwargs)), f"the arguments of {where}")
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
    """Check once per function that it can travel to a worker (closures over locks, sockets... cannot)."""
    key = id(fn)
    if checked.get(key) is fn:
        return
    try:
        cloudpickle.dumps(fn)
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise SerializationError(
            f"{name} cannot be serialized to run remotely: {exc}. It probably captures an unpicklable object "
            "(a lock, a socket, an open file, a client); create that object inside the function instead."
        ) from exc
    checked[key] = fn


@dataclass
class RemoteError:
    """An exception raised by user code in a task or actor method, ready to travel back to the caller."""

    pickled: bytes | None
    type_name: str
    message: str
    traceback: str

    def rebuild(self) -> BaseException:
        exc: BaseException | None = None
        if self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception:
                exc = None
        if exc is None:
            exc = RemoteExceptionProxy(self.type_name, self.message)
        return attach_remote_traceback(exc, self.traceback)


def format_exception(exc: BaseException) -> str:
    """The traceback text of exc, as Python would print it."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def capture_exception(exc: BaseException) -> RemoteError:
    text = format_exception(exc)
    try:
        pickled: bytes | None = cloudpickle.dumps(exc)
        pickle.loads(pickled)  # type: ignore[arg-type]  # exceptions with custom __init__ often pickle but fail to unpickle
    except Exception:
        pickled = None
    return RemoteError(pickled, f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), text)
