"""Fray's exception hierarchy.

Every error Fray raises on its own account is a `FrayError`. An exception raised by user code inside a task or
actor method is re-raised by `get` as the ORIGINAL exception type with its original message; the remote
traceback text is attached as `exc.remote_traceback` (and as a note, so it shows in tracebacks).
"""

from __future__ import annotations

from typing import Any


class FrayError(Exception):
    """Base class of every error Fray raises itself."""


class GetTimeoutError(FrayError, TimeoutError):
    """`get` (or `wait_job`) did not finish within its timeout."""


class TaskCancelledError(FrayError):
    """The task was cancelled before it produced a result."""


class ActorDiedError(FrayError):
    """The actor is dead: killed, its process crashed with no restarts left, or its __init__ raised."""


class ActorUnavailableError(FrayError):
    """The actor's process crashed during this call; the actor is restarting (max_restarts) and later calls may
    succeed on a fresh instance."""


class ActorAlreadyExistsError(FrayError, ValueError):
    """An actor with this name exists already (pass get_if_exists=True to reuse it)."""


class ActorNotFoundError(FrayError, ValueError):
    """No live actor has this name."""


class WorkerCrashedError(FrayError):
    """The process running a task died (and no retries were left)."""


class ObjectStoreFullError(FrayError, MemoryError):
    """The object store of a host has no room for this value (its size is the spec option object_store_memory).
    Free references to values you no longer need, or raise object_store_memory."""


class ObjectLostError(FrayError):
    """The value behind this ref is gone: the process that held it died, and it cannot be made again."""


class SerializationError(FrayError, TypeError):
    """A value could not be serialized to be sent to a task, an actor or the object store."""


class InfeasibleResourcesError(FrayError, ValueError):
    """The resource request can never be satisfied by this context (it exceeds every node)."""


class UnsupportedFeatureError(FrayError, NotImplementedError):
    """The backend lacks a capability this call needs. `.capability` names it."""

    def __init__(self, capability: object, backend: str, detail: str = "") -> None:
        self.capability = capability
        self.backend = backend
        name = getattr(capability, "value", capability)
        message = f"the {backend!r} backend does not support {name!r}"
        if detail:
            message += f": {detail}"
        super().__init__(message)


class BackendNotAvailableError(FrayError, ImportError):
    """The requested backend is unknown or not installed."""


class JobNotFoundError(FrayError, KeyError):
    """No job with this id is known to the cluster context."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class JobExistsError(FrayError, ValueError):
    """A job with this id, or a live job with this name, exists (create_job(if_exists="refuse"), or job_id=)."""


class JobFailedError(FrayError):
    """A job ended FAILED or STOPPED where its success was awaited (JobHandle.wait(raise_on_failure=True)).
    `.info` is the job's JobInfo; for a callable, `.info.error` holds its exception's type, message and
    traceback."""

    def __init__(self, message: str, info: Any = None) -> None:
        super().__init__(message)
        self.info = info

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.info))


class RemoteExceptionProxy(FrayError):
    """Stands in for a remote exception whose type could not be sent back (it did not pickle).

    `.type_name` and the message name the original exception; `remote_traceback` holds its traceback."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(f"{type_name}: {message}")

    def __reduce__(self) -> tuple[object, ...]:  # the default would call __init__ with one argument
        return (type(self), (self.type_name, self.message), dict(self.__dict__))


def attach_remote_traceback(exc: BaseException, traceback_text: str) -> BaseException:
    """Attach the remote traceback text to `exc` (as an attribute and, on Python 3.11+, as a note)."""
    try:
        exc.remote_traceback = traceback_text  # type: ignore[attr-defined]
    except AttributeError:  # exceptions with __slots__
        return exc
    add_note = getattr(exc, "add_note", None)
    notes = getattr(exc, "__notes__", ())
    if add_note is not None and not any(n.startswith("Remote traceback") for n in notes):
        add_note("Remote traceback (most recent call last):\n" + traceback_text.rstrip())
    return exc
