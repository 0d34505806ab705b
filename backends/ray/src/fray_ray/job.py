"""RayJobContext: fray's JobContext on Ray tasks, actors and the object store.

Payloads: an ObjectRef's payload is a ray.ObjectRef; an ActorHandle's payload is a Ray actor handle. Both
pickle through Ray's own serializer (with its reference counting), so refs and handles can be passed into tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import ray
import ray.exceptions as rex

from fray.capabilities import Capability
from fray.context import JobContext
from fray.errors import (
    ActorAlreadyExistsError,
    ActorNotFoundError,
    InfeasibleResourcesError,
    SerializationError,
)
from fray.refs import ActorHandle, ObjectRef, public_methods
from fray.serialization import check_function, find_unserializable_argument
from fray.types import ActorOptions, TaskOptions
from fray_ray import _connect
from fray_ray._remote import Registry, actor_options, is_default_task, task_options, translate

BACKEND = "ray"
_registry = Registry()
_checked_functions: dict[int, Any] = {}
_methods_cache: dict[type, frozenset[str]] = {}
_NODES_TTL = 5.0


def _unwrap_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    for arg in args:
        if type(arg) is ObjectRef:
            return tuple(a.payload if type(a) is ObjectRef else a for a in args)
    return args


def _unwrap_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    for value in kwargs.values():
        if type(value) is ObjectRef:
            return {k: v.payload if type(v) is ObjectRef else v for k, v in kwargs.items()}
    return kwargs


def _is_serialization_error(exc: BaseException) -> bool:
    return isinstance(exc, TypeError) and "serialize" in str(exc)


class RayJobContext(JobContext):
    """A JobContext on Ray. See docs/backends/ray.md for the options and behaviour."""

    backend: ClassVar[str] = BACKEND
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.DETACHED_ACTORS,
            Capability.TASK_ENV_VARS,
            Capability.TASK_PACKAGES,
            Capability.CANCEL_RUNNING,
            Capability.PROCESS_ISOLATION,
            Capability.MULTI_HOST,
            Capability.ZERO_COPY_OBJECTS,
        }
    )

    def __init__(
        self,
        address: str | None = None,
        namespace: str | None = None,
        log_to_driver: bool = True,
        _attach_only: bool = False,
        **init_kwargs: Any,
    ) -> None:
        """address: "host:port" of a running cluster (else RAY_ADDRESS; else a private local instance sized by
        init_kwargs: num_cpus, num_gpus, object_store_memory, resources). _attach_only: inside a Ray worker."""
        self._owns_connection = not _attach_only
        self._closed = False
        if self._owns_connection:
            _connect.acquire(address, namespace, init_kwargs, log_to_driver)
        self.namespace: str = ray.get_runtime_context().namespace
        self._nodes: list[dict[str, float]] = []
        self._nodes_at = -_NODES_TTL

    def __repr__(self) -> str:
        return f"RayJobContext(namespace={self.namespace!r})"

    # ------------------------------------------------------------------ resources
    def node_resources(self) -> list[dict[str, float]]:
        now = time.monotonic()
        if now - self._nodes_at > _NODES_TTL:
            self._nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
            self._nodes_at = now
        return self._nodes

    def check_feasible(self, request: Mapping[str, float], what: str) -> None:
        try:
            super().check_feasible(request, what)
        except InfeasibleResourcesError:
            self._nodes_at = -_NODES_TTL  # the cached view may predate a node that joined since: look again
            super().check_feasible(request, what)

    # ------------------------------------------------------------------ tasks
    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRef:
        remote = _registry.lookup(fn)
        if remote is None:
            check_function(fn, _checked_functions)
            remote = _registry.remote_function(fn)
        if not is_default_task(options):
            remote = remote.options(**task_options(options))
        try:
            ref = remote.remote(*_unwrap_args(args), **_unwrap_kwargs(kwargs))
        except TypeError as exc:
            if _is_serialization_error(exc):
                name = getattr(fn, "__qualname__", repr(fn))
                raise find_unserializable_argument(name, args, kwargs, exc) from None
            raise
        return ObjectRef(ref, BACKEND)

    # ------------------------------------------------------------------ actors
    def _create_actor(
        self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], options: ActorOptions
    ) -> ActorHandle:
        actor_cls = _registry.lookup(klass)
        if actor_cls is None:
            check_function(klass, _checked_functions)
            actor_cls = _registry.actor_class(klass)
        try:
            handle = actor_cls.options(**actor_options(options, None)).remote(
                *_unwrap_args(args), **_unwrap_kwargs(kwargs)
            )
        except TypeError as exc:
            if _is_serialization_error(exc):
                raise find_unserializable_argument(klass.__qualname__, args, kwargs, exc) from None
            raise
        except ValueError as exc:
            if "already taken" in str(exc) or isinstance(exc, rex.ActorAlreadyExistsError):
                raise ActorAlreadyExistsError(
                    f"an actor named {options.name!r} exists already in namespace {self.namespace!r}; "
                    "pass get_if_exists=True to reuse it"
                ) from None
            raise
        methods = _methods_cache.get(klass)
        if methods is None:
            methods = _methods_cache[klass] = public_methods(klass)
        return ActorHandle(handle, BACKEND, klass.__name__, methods, options.name, self)

    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        try:
            ref = getattr(handle.payload, method).remote(*_unwrap_args(args), **_unwrap_kwargs(kwargs))
        except TypeError as exc:
            if _is_serialization_error(exc):
                raise find_unserializable_argument(f"{handle.class_name}.{method}", args, kwargs, exc) from None
            raise
        return ObjectRef(ref, BACKEND)

    def _get_actor(self, name: str) -> ActorHandle:
        try:
            handle = ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            raise ActorNotFoundError(f"no live actor named {name!r} in namespace {self.namespace!r}") from None
        descriptor = handle._ray_actor_creation_function_descriptor
        methods = frozenset(m for m in handle._ray_method_signatures if not m.startswith("_"))
        return ActorHandle(handle, BACKEND, descriptor.class_name.rpartition(".")[2], methods, name, self)

    def _kill(self, handle: ActorHandle) -> None:
        ray.kill(handle.payload, no_restart=True)
        if handle.name is None:
            return
        # ray.kill is asynchronous; wait (briefly) until the name is free, so it can be reused at once.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                found = ray.get_actor(handle.name, namespace=self.namespace)
            except ValueError:
                return
            if found._actor_id != handle.payload._actor_id:
                return
            time.sleep(0.02)

    # ------------------------------------------------------------------ objects
    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        try:
            return ray.get([r.payload for r in refs], timeout=timeout)  # type: ignore[no-any-return]
        except Exception as exc:
            new = translate(exc)
            if new is exc:
                raise
            raise new from None

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        payloads = [r.payload for r in refs]
        ready, _ = ray.wait(payloads, num_returns=num_returns, timeout=timeout, fetch_local=False)
        if len(ready) == len(payloads):
            return set(range(len(payloads)))
        index = {p: i for i, p in enumerate(payloads)}
        return {index[p] for p in ready}

    def _put(self, obj: Any) -> ObjectRef:
        try:
            return ObjectRef(ray.put(obj), BACKEND)
        except TypeError as exc:
            if _is_serialization_error(exc):
                raise SerializationError(f"cannot serialize the put value of type {type(obj).__name__}") from exc
            raise

    def _cancel(self, ref: ObjectRef) -> None:
        try:
            ray.cancel(ref.payload, force=False, recursive=True)
        except Exception:  # already finished, or an object made by put: nothing to cancel
            pass

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_connection:
            _connect.release()
