"""Exceptions raised by user code in a task or actor, on their way back to the caller: one home for capturing
them, checking that they travel, and rebuilding them.

The caller gets the ORIGINAL exception type with its message, and the remote traceback attached
(`exc.remote_traceback`, and a note). An exception that does not survive pickling (a custom __init__, an
unpicklable attribute) arrives as a `RemoteExceptionProxy` naming its type and message.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass
from typing import Any

import cloudpickle

from fray.errors import RemoteExceptionProxy, attach_remote_traceback

__all__ = ["RemoteError", "capture_exception", "format_exception", "portable", "rebuild"]


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
    """exc as it will travel: pickled if it survives a round trip, else by type name and message."""
    text = format_exception(exc)
    try:
        pickled: bytes | None = cloudpickle.dumps(exc)
        pickle.loads(pickled)  # type: ignore[arg-type]  # exceptions with custom __init__ often pickle but fail to unpickle
    except Exception:
        pickled = None
    return RemoteError(pickled, f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), text)


def portable(exc: BaseException) -> BaseException:
    """exc itself if it survives a pickle round trip, else a RemoteExceptionProxy naming its type and message,
    with its traceback attached (for engines that pickle exceptions themselves, such as Ray and Monarch)."""
    try:
        pickle.loads(cloudpickle.dumps(exc))
        return exc
    except Exception:
        remote = capture_exception(exc)
        return attach_remote_traceback(RemoteExceptionProxy(remote.type_name, remote.message), remote.traceback)


def rebuild(error: Any) -> BaseException:
    """The exception to raise for a failure that travelled: a RemoteError is rebuilt; an exception is itself."""
    return error.rebuild() if isinstance(error, RemoteError) else error
