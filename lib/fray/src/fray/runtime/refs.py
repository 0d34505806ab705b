"""The two handle types user code sees, identical for every backend.

An `ObjectRef` names a value that is or will be available (a task result, an actor call result, a put value).
An `ActorHandle` names a live actor; `handle.method(*args, **kwargs)` submits a call and returns an ObjectRef.
Each carries a backend-specific `payload`; both pickle, so they can be passed into tasks and actors, where they
bind to the job context current there. An `ObjectRefStream` (fray.runtime.streams) is the refs of a generator's items.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, cast

from fray.runtime import current

__all__ = ["ActorHandle", "ActorMethod", "ObjectRef", "ObjectRefStream", "RefContext", "StreamSource"]


class RefContext(Protocol):
    """What refs and handles need of their job context (a fray.context.JobContext, which this module does not
    import: the context is built on refs)."""

    def _future_of(self, ref: ObjectRef) -> Future[Any]: ...

    def _call_actor_checked(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRef: ...

    def _call_actor_stream_checked(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream: ...


class ObjectRef:
    """A reference to a (future) value. Read it with `ctx.get(ref)`; `ctx.wait` reports readiness."""

    __slots__ = ("__weakref__", "backend", "payload")

    def __init__(self, payload: Any, backend: str) -> None:
        self.payload = payload
        self.backend = backend

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectRef, (self.payload, self.backend))

    def future(self) -> Future[Any]:
        """A concurrent.futures.Future that completes with this ref's value (or its exception)."""
        return cast(RefContext, current.context_for(self.backend))._future_of(self)

    def __await__(self) -> Generator[Any, None, Any]:
        """`await ref` in asyncio code: the value, without blocking the event loop's thread."""
        return asyncio.wrap_future(self.future()).__await__()

    def __repr__(self) -> str:
        return f"ObjectRef({self.backend}:{self.payload!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and self.backend == other.backend and self.payload == other.payload

    def __hash__(self) -> int:
        return hash((self.backend, self.payload))


class ActorMethod:
    """`handle.method`: calling it submits the call and returns an ObjectRef."""

    __slots__ = ("_handle", "_name")

    def __init__(self, handle: ActorHandle, name: str) -> None:
        self._handle = handle
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> ObjectRef:
        handle = self._handle
        return handle._context()._call_actor_checked(handle, self._name, args, kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> ObjectRefStream:
        """Call a generator method: one ref per item it yields, in order, as they are produced."""
        handle = self._handle
        return handle._context()._call_actor_stream_checked(handle, self._name, args, kwargs)

    def __getattr__(self, attr: str) -> Any:
        # Ray's habit, `handle.method.remote(...)`: fray calls the method itself
        if attr == "remote":
            raise AttributeError(
                f"fray actor methods are called directly: {self._name}(...) returns an ObjectRef (did you mean "
                f"handle.{self._name}(...)? `.remote(...)` is Ray's spelling)"
            )
        raise AttributeError(f"'ActorMethod' object has no attribute {attr!r}")

    def __repr__(self) -> str:
        return f"<actor method {self._handle.class_name}.{self._name}>"


class ActorHandle:
    """A handle to one live actor. Call its methods directly: `handle.add(1)` -> ObjectRef."""

    __slots__ = ("__weakref__", "_ctx", "backend", "class_name", "methods", "name", "payload")

    def __init__(
        self,
        payload: Any,
        backend: str,
        class_name: str,
        methods: frozenset[str],
        name: str | None = None,
        ctx: RefContext | None = None,
    ) -> None:
        self.payload = payload
        self.backend = backend
        self.class_name = class_name
        self.methods = methods
        self.name = name
        self._ctx = ctx

    def _context(self) -> RefContext:
        if self._ctx is not None:
            return self._ctx
        return cast(RefContext, current.get_job_context())

    def __getattr__(self, attr: str) -> ActorMethod:
        if attr.startswith("__") or attr not in self.methods:
            raise AttributeError(
                f"actor {self.class_name} has no method {attr!r}; its methods are: {', '.join(sorted(self.methods))}"
            )
        return ActorMethod(self, attr)

    def __reduce__(self) -> tuple[Any, ...]:
        # The context does not travel: on arrival the handle binds to the job context current there.
        return (ActorHandle, (self.payload, self.backend, self.class_name, self.methods, self.name))

    def __repr__(self) -> str:
        label = f" name={self.name!r}" if self.name else ""
        return f"ActorHandle({self.backend}:{self.class_name}{label})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and self.backend == other.backend and self.payload == other.payload

    def __hash__(self) -> int:
        return hash((self.backend, self.payload))


class StreamSource(Protocol):
    def next_ref(self, timeout: float | None) -> ObjectRef | None:
        """The next item's ref (None at the end of the stream); GetTimeoutError after timeout."""

    def close(self) -> None:
        """The consumer stops reading: stop the producer (or let it drain) and free what it holds."""


class ObjectRefStream:
    """An iterator of ObjectRefs, one per item a generator yields, in order, as they are produced.

    `for ref in stream: ctx.get(ref)`; `stream.next_ref(timeout=...)` for a bounded wait; breaking out early and
    dropping the stream (or `stream.close()`, or `with stream:`) stops the producer.
    """

    __slots__ = ("__weakref__", "_closed", "_done", "_source", "backend")

    def __init__(self, source: StreamSource, backend: str) -> None:
        self._source = source
        self.backend = backend
        self._done = False
        self._closed = False

    def __iter__(self) -> ObjectRefStream:
        return self

    def __next__(self) -> ObjectRef:
        ref = self.next_ref()
        if ref is None:
            raise StopIteration
        return ref

    def next_ref(self, timeout: float | None = None) -> ObjectRef | None:
        """The next item's ref, waiting up to `timeout` seconds for the producer; None once the stream ended."""
        if self._done:
            return None
        ref = self._source.next_ref(timeout)
        if ref is None:
            self._done = True
        return ref

    def close(self) -> None:
        """Stop the producer if it still runs. Idempotent; refs already handed out stay readable."""
        if not self._closed:
            self._closed = True
            self._done = True
            self._source.close()

    def __enter__(self) -> ObjectRefStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown, a backend already gone: nothing to stop then
            pass

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("an ObjectRefStream cannot be passed to a task or actor; pass the refs it yields instead")

    def __repr__(self) -> str:
        state = "ended" if self._done else "open"
        return f"ObjectRefStream({self.backend}, {state})"


@functools.lru_cache(maxsize=1024)
def public_methods(klass: type) -> frozenset[str]:
    """The methods of an actor class that callers may invoke (public callables, inherited ones included)."""
    names = set()
    for name in dir(klass):
        if name.startswith("_"):
            continue
        if callable(getattr(klass, name, None)):
            names.add(name)
    return frozenset(names)


def async_methods(klass: type) -> frozenset[str]:
    """The public `async def` methods (and async generators) of an actor class: it is then an async actor
    (capability async_actors: they run on an event loop inside the actor)."""
    names = set()
    for name in dir(klass):
        if name.startswith("_"):
            continue
        attr = getattr(klass, name, None)
        if inspect.iscoroutinefunction(attr) or inspect.isasyncgenfunction(attr):
            names.add(name)
    return frozenset(names)


def top_level_refs(args: Sequence[Any], kwargs: Mapping[str, Any], backend: str) -> list[ObjectRef]:
    """The ObjectRefs of `backend` among a call's top-level arguments: the ones a task waits for and receives as
    values (the rule every backend keeps; refs nested in containers arrive as refs)."""
    refs = [a for a in args if isinstance(a, ObjectRef) and a.backend == backend]
    refs += [v for v in kwargs.values() if isinstance(v, ObjectRef) and v.backend == backend]
    return refs


def with_values(
    args: Sequence[Any], kwargs: Mapping[str, Any], value_of: Callable[[ObjectRef], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with each top-level ObjectRef replaced by value_of(ref) (which raises the ref's own
    error if its task failed: the task then fails with it); refs nested in containers stay refs."""
    return (
        tuple(value_of(a) if isinstance(a, ObjectRef) else a for a in args),
        {k: value_of(v) if isinstance(v, ObjectRef) else v for k, v in kwargs.items()},
    )
