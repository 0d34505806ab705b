"""RayJobContext: fray's JobContext on Ray tasks, actors and the object store.

Payloads: an ObjectRef's payload is a ray.ObjectRef; an ActorHandle's payload is a Ray actor handle. Both
pickle through Ray's own serializer (with its reference counting), so refs and handles can be passed into tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, ClassVar

import ray
import ray.exceptions as rex
from ray.util.placement_group import get_placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fray.capabilities import Capability
from fray.context import JobContext
from fray.current import ActorInfo
from fray.errors import (
    ActorAlreadyExistsError,
    ActorNotFoundError,
    InfeasibleResourcesError,
    SerializationError,
    TaskCancelledError,
)
from fray.groups import ActorGroup, Member
from fray.refs import ActorHandle, ObjectRef, public_methods
from fray.serialization import check_function, find_unserializable_argument
from fray.streams import ObjectRefStream
from fray.transfers import PathStats
from fray.types import ActorOptions, Lifetime, TaskOptions
from fray_ray import _connect, _groups, _remote
from fray_ray._remote import MEMBER_KWARG, Registry, actor_options, is_default_task, task_options, translate
from fray_ray._streams import RayStreamSource
from fray_ray._values import Packed, pack, pack_args, pack_kwargs, take_unpacked_bytes

BACKEND = "ray"
_registry = Registry()
_stream_registry = Registry()  # generator-task registrations (num_returns="streaming"), apart from plain ones
_checked_functions: dict[int, Any] = {}
_methods_cache: dict[type, frozenset[str]] = {}
_NODES_TTL = 5.0
_DEPS_PRUNE_MIN = 16  # pending-argument entries kept before the first prune (then twice what survived one)
_STORE_PATH = "ray-object-store"
_NAME_TIMEOUT = 10.0  # a named actor whose __init__ fails fast may never be seen by name
_SHARE_BYTES = 100 * 1024  # a group call's argument at least this big is put once and read by every member


def _unwrap_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Top-level fray refs become Ray refs (Ray resolves them); arguments holding torch tensors are packed."""
    for arg in args:
        if type(arg) is ObjectRef:
            args = tuple(a.payload if type(a) is ObjectRef else a for a in args)
            break
    return pack_args(args)


def _unwrap_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    for value in kwargs.values():
        if type(value) is ObjectRef:
            kwargs = {k: v.payload if type(v) is ObjectRef else v for k, v in kwargs.items()}
            break
    return pack_kwargs(kwargs)


def _known_nbytes(value: Any) -> int:
    """The size of a value Ray returned as is, where it is known without a walk (numpy, bytes), else 0."""
    nbytes = getattr(value, "nbytes", None)  # numpy arrays (read-only views of the object store)
    if type(nbytes) is int and type(value).__module__ == "numpy":
        return nbytes
    if type(value) in (bytes, bytearray, memoryview):
        return len(memoryview(value).cast("B"))
    return 0


def _worth_sharing(value: Any) -> bool:
    if type(value) is Packed:
        return sum(memoryview(b).nbytes for b in value.blob.buffers) + len(value.blob.data) >= _SHARE_BYTES
    return _known_nbytes(value) >= _SHARE_BYTES


def _share_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A group call's large arguments put once (each member's call then reads that one object)."""
    if any(_worth_sharing(a) for a in args):
        return tuple(ray.put(a) if _worth_sharing(a) else a for a in args)
    return args


def _share_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    if any(_worth_sharing(v) for v in kwargs.values()):
        return {k: ray.put(v) if _worth_sharing(v) else v for k, v in kwargs.items()}
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
            Capability.STREAMING,
            Capability.SPMD_GROUPS,
            Capability.ASYNC_ACTORS,
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
        super().__init__(owns_resources=not _attach_only)  # a worker's context belongs to its driver
        self._owns_connection = not _attach_only
        if self._owns_connection:
            _connect.acquire(address, namespace, init_kwargs, log_to_driver)
        self.namespace: str = ray.get_runtime_context().namespace
        self._nodes: list[dict[str, float]] = []
        self._nodes_at = -_NODES_TTL
        self._last_feasible: dict[str, float] | None = None
        self._named: dict[str, Any] = {}  # name -> Ray handle of the named actors created here
        # task's ref -> its Ray ObjectRef arguments that may not be ready yet (see _cancel); weakly keyed, so an
        # entry never outlives the task's ref. _puts: refs made by put here (always ready, never kept).
        self._deps: weakref.WeakKeyDictionary[ObjectRef, list[Any]] = weakref.WeakKeyDictionary()
        self._puts: weakref.WeakSet[ObjectRef] = weakref.WeakSet()
        self._deps_prune_at = _DEPS_PRUNE_MIN
        self._deps_lock = threading.Lock()
        self._gets = PathStats()  # this process's reads of stored values (ctx.get)
        self._gets_lock = threading.Lock()
        self._cancelled: set[bytes] = set()
        self._groups: dict[Any, Any] = {}  # placement group id -> placement group of the groups created here

    def __repr__(self) -> str:
        return f"RayJobContext(namespace={self.namespace!r})"

    # ------------------------------------------------------------------ resources
    def node_resources(self) -> list[dict[str, float]]:
        self._refuse_if_shut_down()
        now = time.monotonic()
        if now - self._nodes_at > _NODES_TTL:
            self._nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
            self._nodes_at = now
        return self._nodes

    def check_feasible(self, request: Mapping[str, float], what: str) -> None:
        # Hot path: most submissions repeat the previous request ({"CPU": 1.0}); skip the scan while the
        # node view it was checked against is current.
        self._refuse_if_shut_down()
        if request == self._last_feasible and time.monotonic() - self._nodes_at <= _NODES_TTL:
            return
        try:
            super().check_feasible(request, what)
        except InfeasibleResourcesError:
            self._nodes_at = -_NODES_TTL  # the cached view may predate a node that joined since: look again
            super().check_feasible(request, what)
        self._last_feasible = dict(request)

    # ------------------------------------------------------------------ tasks
    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRef:
        self._refuse_if_shut_down()
        remote = _registry.lookup(fn)
        if remote is None:
            check_function(fn, _checked_functions)
            remote = _registry.remote_function(fn)
        if not is_default_task(options):
            if options.max_calls is not None:  # Ray takes max_calls only at registration
                remote = _registry.remote_function(fn, options.max_calls)
            remote = remote.options(**task_options(options))
        ray_args, ray_kwargs = _unwrap_args(args), _unwrap_kwargs(kwargs)
        try:
            ref = remote.remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if _is_serialization_error(exc):
                name = getattr(fn, "__qualname__", repr(fn))
                raise find_unserializable_argument(name, args, kwargs, exc) from None
            raise
        result = ObjectRef(ref, BACKEND)
        if ray_args is not args or ray_kwargs is not kwargs:
            self._note_dependencies(result, args, kwargs)
        return result

    # ------------------------------------------------------------------ actors
    def _create_actor(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: ActorOptions,
        member: Member | None = None,
        *,
        _ray_options: Mapping[str, Any] | None = None,
    ) -> ActorHandle:
        """member: who the actor is in its group (fray.current_actor()) and an SPMD member's environment, both
        set in the actor's process before klass.__init__ runs. _ray_options: extra Ray options (a group's
        placement, a Ray name for an unnamed group's member)."""
        self._refuse_if_shut_down()
        actor_cls = _registry.lookup(klass)
        if actor_cls is None:
            check_function(klass, _checked_functions)
            actor_cls = _registry.actor_class(klass)
        methods = _methods_cache.get(klass)
        if methods is None:
            methods = _methods_cache[klass] = public_methods(klass)
        name = options.name
        if name is not None and options.get_if_exists:
            existing = self._lookup(name)
            if existing is not None:
                return ActorHandle(existing, BACKEND, klass.__name__, methods, name, self)
        ray_options = actor_options(options)
        if _ray_options:
            ray_options.update(_ray_options)
        ray_kwargs = _unwrap_kwargs(kwargs)
        if member is not None:
            ray_kwargs = {**ray_kwargs, MEMBER_KWARG: (member.info, dict(member.env))}
        elif name is not None:
            ray_kwargs = {**ray_kwargs, MEMBER_KWARG: (ActorInfo(name=name), {})}
        try:
            handle = actor_cls.options(**ray_options).remote(*_unwrap_args(args), **ray_kwargs)
        except TypeError as exc:
            if _is_serialization_error(exc):
                raise find_unserializable_argument(klass.__qualname__, args, kwargs, exc) from None
            raise
        except ValueError as exc:
            if not ("already taken" in str(exc) or isinstance(exc, rex.ActorAlreadyExistsError)):
                raise
            handle = None
        if name is not None:
            # Ray registers a name asynchronously and checks it with a racy lookup first. Wait until the name
            # resolves: to our actor (we won), or to another one (we lost a race, and Ray drops ours).
            winner = self._await_name(name, handle)
            if winner is not None and (handle is None or winner._actor_id != handle._actor_id):
                if not options.get_if_exists:
                    raise ActorAlreadyExistsError(
                        f"an actor named {name!r} exists already in namespace {self.namespace!r}; "
                        "pass get_if_exists=True to reuse it"
                    )
                handle = winner
            elif handle is None:
                raise ActorAlreadyExistsError(f"an actor named {name!r} exists already (and just died)")
            # Ray garbage-collects a non-detached actor once its creator drops its handles, even when named.
            # A named actor must stay reachable by name: keep a handle for the life of this process.
            if options.lifetime is not Lifetime.DETACHED:
                self._named[name] = handle
        return ActorHandle(handle, BACKEND, klass.__name__, methods, name, self)

    def _lookup(self, name: str) -> Any:
        try:
            return ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return None

    def _await_name(self, name: str, mine: Any) -> Any:
        deadline = time.monotonic() + _NAME_TIMEOUT
        pause = 0.001
        while True:
            found = self._lookup(name)
            if found is not None or time.monotonic() > deadline:
                return found
            if mine is None and time.monotonic() > deadline - _NAME_TIMEOUT + 1.0:
                return None  # the actor that held the name died meanwhile
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        self._refuse_if_shut_down()
        ray_args, ray_kwargs = _unwrap_args(args), _unwrap_kwargs(kwargs)
        try:
            ref = getattr(handle.payload, method).remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if _is_serialization_error(exc):
                raise find_unserializable_argument(f"{handle.class_name}.{method}", args, kwargs, exc) from None
            raise
        result = ObjectRef(ref, BACKEND)
        if ray_args is not args or ray_kwargs is not kwargs:
            self._note_dependencies(result, args, kwargs)
        return result

    def _get_actor(self, name: str) -> ActorHandle:
        self._refuse_if_shut_down()
        try:
            handle = ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            raise ActorNotFoundError(f"no live actor named {name!r} in namespace {self.namespace!r}") from None
        descriptor = handle._ray_actor_creation_function_descriptor
        methods = frozenset(m for m in handle._ray_method_signatures if not m.startswith("_"))
        return ActorHandle(handle, BACKEND, descriptor.class_name.rpartition(".")[2], methods, name, self)

    def _kill(self, handle: ActorHandle) -> None:
        self._refuse_if_shut_down()
        self._kill_handles([handle])

    def _kill_handles(self, handles: Iterable[ActorHandle]) -> None:
        """ray.kill each (no restart), then wait (briefly) until this driver sees each one dead and its name is
        free, so that a call made after kill fails and the name can be reused."""
        handles = list(handles)
        named: list[tuple[str, Any]] = []
        for handle in handles:
            ray.kill(handle.payload, no_restart=True)
            if handle.name is None:
                continue
            kept = self._named.get(handle.name)
            if kept is not None and kept._actor_id == handle.payload._actor_id:
                del self._named[handle.name]
            named.append((handle.name, handle.payload._actor_id))
        deadline = time.monotonic() + 10.0
        _wait_until_dead([handle.payload for handle in handles], deadline)
        for name, actor_id in named:
            while time.monotonic() < deadline:
                try:
                    found = ray.get_actor(name, namespace=self.namespace)
                except ValueError:
                    break
                if found._actor_id != actor_id:
                    break
                time.sleep(0.02)

    # ------------------------------------------------------------------ groups
    def _create_actor_group(
        self,
        klass: type,
        count: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: ActorOptions,
        placement: str,
        strict: bool,
        distributed: bool,
    ) -> ActorGroup:
        """The members in one placement group (see _groups), all or nothing: if any step fails, the members
        created so far are killed and the placement group removed."""
        self._refuse_if_shut_down()
        what = f"actor group {options.name or klass.__name__}"
        pg = _groups.create_placement_group(options, count, placement, strict, what)
        detached = options.lifetime is Lifetime.DETACHED
        # An unnamed group's members get a Ray name too (unique), so that Ray's ActorDiedError names the rank.
        ray_prefix = options.name or f"fray-group-{uuid.uuid4().hex[:12]}"
        handles: list[ActorHandle] = []
        try:
            for member in _groups.members(pg, count, options.name, distributed):
                rank = member.info.rank
                extra: dict[str, Any] = {
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=rank, placement_group_capture_child_tasks=False
                    )
                }
                if options.name is None:
                    extra["name"] = f"{ray_prefix}/{rank}"
                member_options = dataclasses.replace(options, name=member.info.name, get_if_exists=False)
                handles.append(
                    self._create_actor(klass, args, kwargs, member_options, member=member, _ray_options=extra)
                )
        except BaseException:
            try:
                self._kill_handles(handles)
            except Exception:  # the creation error is the one to report
                pass
            remove_placement_group(pg)
            raise
        if not detached:
            self._groups[pg.id] = pg
        return ActorGroup(handles, options.name, _groups.RayGroup(pg, count, detached), ctx=self)

    def _call_group(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]:
        """One Ray call per member, with the arguments converted once; a large argument is put once and every
        member reads that one object (Ray resolves a top-level ref argument to its value)."""
        self._refuse_if_shut_down()
        ray_args, ray_kwargs = _unwrap_args(args), _unwrap_kwargs(kwargs)
        if len(group.handles) > 1:
            ray_args, ray_kwargs = _share_args(ray_args), _share_kwargs(ray_kwargs)
        noted = ray_args is not args or ray_kwargs is not kwargs
        refs = []
        for handle in group.handles:
            try:
                ref = getattr(handle.payload, method).remote(*ray_args, **ray_kwargs)
            except TypeError as exc:
                if _is_serialization_error(exc):
                    raise find_unserializable_argument(f"{handle.class_name}.{method}", args, kwargs, exc) from None
                raise
            result = ObjectRef(ref, BACKEND)
            if noted:
                self._note_dependencies(result, args, kwargs)
            refs.append(result)
        return refs

    def _kill_group(self, group: ActorGroup) -> None:
        """Kill the members; a whole group (not a slice) also loses its placement group (removing it would kill
        every member in it, so a slice keeps it)."""
        self._refuse_if_shut_down()
        self._kill_handles(group.handles)
        payload = group.payload
        pg = None
        if isinstance(payload, _groups.RayGroup):
            if sorted(group.ranks) == list(range(payload.size)):
                pg = payload.placement_group
        elif group.name is not None and group.ranks == tuple(range(len(group))):
            try:  # a group found again by name (get_if_exists): its placement group is named after it
                pg = get_placement_group(_groups.pg_name(group.name))
            except ValueError:
                pg = None
        if pg is not None:
            self._groups.pop(pg.id, None)
            try:
                remove_placement_group(pg)
            except Exception:  # removed already
                pass

    # ------------------------------------------------------------------ streaming
    def _create_stream_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRefStream:
        """A Ray generator task. Never retried (max_retries=0): a retry would run the generator's side effects
        again after items were delivered; Ray cannot retry only before the first item."""
        self._refuse_if_shut_down()
        remote = _stream_registry.lookup(fn)
        if remote is None:
            check_function(fn, _checked_functions)
            remote = _stream_registry.stream_function(fn)
        if options.max_calls is not None:
            remote = _stream_registry.stream_function(fn, options.max_calls)
        ray_options = task_options(options)
        ray_options["max_retries"] = 0
        ray_options["retry_exceptions"] = False
        ray_args, ray_kwargs = _unwrap_args(args), _unwrap_kwargs(kwargs)
        try:
            generator = remote.options(**ray_options).remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if _is_serialization_error(exc):
                name = getattr(fn, "__qualname__", repr(fn))
                raise find_unserializable_argument(name, args, kwargs, exc) from None
            raise
        return ObjectRefStream(
            RayStreamSource(generator, self._pending_args(args, kwargs), lambda: self.is_shut_down), BACKEND
        )

    def _call_actor_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        self._refuse_if_shut_down()
        ray_args, ray_kwargs = _unwrap_args(args), _unwrap_kwargs(kwargs)
        try:
            remote_method = getattr(handle.payload, method).options(num_returns="streaming")
            generator = remote_method.remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if _is_serialization_error(exc):
                raise find_unserializable_argument(f"{handle.class_name}.{method}", args, kwargs, exc) from None
            raise
        return ObjectRefStream(
            RayStreamSource(generator, self._pending_args(args, kwargs), lambda: self.is_shut_down), BACKEND
        )

    def _pending_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The Ray refs among the top-level arguments that may not be ready (not made by put here)."""
        puts = self._puts
        deps = [a.payload for a in (*args, *kwargs.values()) if type(a) is ObjectRef and a not in puts]
        return list(dict.fromkeys(deps))

    # ------------------------------------------------------------------ futures
    def _future(self, ref: ObjectRef) -> Future[Any]:
        """From Ray's own ObjectRef.future() (a callback, no thread per ref), with the value as get gives it and
        the exceptions get raises."""
        self._refuse_if_shut_down()
        payload = ref.payload
        out: Future[Any] = Future()
        if self._cancelled and payload.binary() in self._cancelled:
            out.set_exception(TaskCancelledError(f"task {payload.hex()} was cancelled"))
            return out
        try:
            inner = payload.future()
        except AttributeError:  # not a plain Ray ObjectRef: the core's default (a thread in _get)
            return super()._future(ref)

        def settle(done: Future[Any]) -> None:
            try:
                value = done.result()
            except BaseException as exc:
                out.set_exception(translate(exc))
                return
            out.set_result(value)

        inner.add_done_callback(settle)
        return out

    # ------------------------------------------------------------------ objects
    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        self._refuse_if_shut_down()
        payloads = [r.payload for r in refs]
        if self._cancelled:
            self._raise_if_cancelled(payloads)
        take_unpacked_bytes()  # start counting from zero (a failed get may have left some)
        start = time.perf_counter()
        try:
            values: list[Any] = ray.get(payloads, timeout=timeout)
        except Exception as exc:
            new = translate(exc)
            if new is exc:
                raise
            raise new from None
        seconds = time.perf_counter() - start
        nbytes = take_unpacked_bytes() + sum(_known_nbytes(v) for v in values)
        with self._gets_lock:
            self._gets = self._gets + PathStats(len(values), nbytes, seconds)
        return values

    def _transfer_stats(self) -> dict[str, PathStats]:
        """This process's gets, all by Ray's object store: count of values, bytes where known without a walk
        (out-of-band buffers of packed values, numpy arrays, bytes; 0 for other values) and seconds in
        ray.get. Task and actor arguments resolved inside workers are not counted (Ray resolves them)."""
        self._refuse_if_shut_down()
        with self._gets_lock:
            stats = self._gets
        return {_STORE_PATH: stats} if stats.count else {}

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        self._refuse_if_shut_down()
        payloads = [r.payload for r in refs]
        done: set[int] = set()
        if self._cancelled:  # cancelled by fray before Ray could be told: complete (with TaskCancelledError)
            done = {i for i, p in enumerate(payloads) if p.binary() in self._cancelled}
            if len(done) >= num_returns:
                return done
            num_returns -= len(done)
            payloads = [p for i, p in enumerate(payloads) if i not in done]
        ready, _ = ray.wait(payloads, num_returns=num_returns, timeout=timeout, fetch_local=False)
        if not done and len(ready) == len(payloads):
            return set(range(len(payloads)))
        ready_set = set(ready)
        rest = [i for i in range(len(refs)) if i not in done]
        return done | {i for i, p in zip(rest, payloads, strict=True) if p in ready_set}

    def _put(self, obj: Any) -> ObjectRef:
        self._refuse_if_shut_down()
        try:
            ref = ObjectRef(ray.put(pack(obj)), BACKEND)
        except TypeError as exc:
            if _is_serialization_error(exc):
                raise SerializationError(f"cannot serialize the put value of type {type(obj).__name__}") from exc
            raise
        self._puts.add(ref)
        return ref

    # ------------------------------------------------------------------ cancel
    # Ray 2.60 aborts the driver process (reference_counter.cc "Check failed: submitted_task_ref_count > 0")
    # when a task is cancelled while it waits for its ObjectRef arguments and those arguments then arrive.
    # So for such a task fray marks the ref cancelled at once (get raises TaskCancelledError, wait counts it
    # done) and tells Ray only once the arguments are ready.
    #
    # Holding a ray.ObjectRef pins its object in the store, so the arguments kept are only those that may be
    # pending (not refs made by put, which are ready at once) and only while they might matter: an entry goes
    # when the task's ref is dropped (weak key) or when a prune finds its arguments ready. (Fray used to keep
    # every argument until 256 tasks had been submitted: each 100 MiB put -> task object stayed pinned, fray's
    # puts landed on fresh store memory and then spilled to disk, 6-7x slower than raw Ray.)
    def _note_dependencies(self, result: ObjectRef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        puts = self._puts
        deps = [a.payload for a in (*args, *kwargs.values()) if type(a) is ObjectRef and a not in puts]
        if not deps:
            return
        with self._deps_lock:
            if len(self._deps) >= self._deps_prune_at:
                self._prune_dependencies()
            self._deps[result] = list(dict.fromkeys(deps))  # ray.wait refuses duplicates

    def _prune_dependencies(self) -> None:
        """Drop the entries whose arguments are all ready (one ray.wait for all: ~3 us if all are ready,
        ~0.1 ms otherwise); prune again once the survivors have doubled (O(1) amortized per task)."""
        entries = list(self._deps.items())
        every = list(dict.fromkeys(dep for _, deps in entries for dep in deps))
        if every:
            ready, _ = ray.wait(every, num_returns=len(every), timeout=0, fetch_local=False)
            ready_set = set(ready)
            for key, deps in entries:
                if all(dep in ready_set for dep in deps):
                    self._deps.pop(key, None)
        self._deps_prune_at = max(_DEPS_PRUNE_MIN, 2 * len(self._deps))

    def _raise_if_cancelled(self, payloads: list[Any]) -> None:
        for p in payloads:
            if p.binary() in self._cancelled:
                raise TaskCancelledError(f"task {p.hex()} was cancelled")

    def _cancel(self, ref: ObjectRef) -> None:
        self._refuse_if_shut_down()
        payload = ref.payload
        key = payload.binary()
        with self._deps_lock:
            deps = self._deps.pop(ref, None)
        if deps:
            _, pending = ray.wait(deps, num_returns=len(deps), timeout=0, fetch_local=False)
            if pending:
                self._cancelled.add(key)
                threading.Thread(target=self._cancel_when_ready, args=(payload, deps), daemon=True).start()
                return
        self._ray_cancel(payload)

    def _cancel_when_ready(self, payload: Any, deps: list[Any]) -> None:
        try:
            while not self.is_shut_down:
                _, pending = ray.wait(deps, num_returns=len(deps), timeout=1.0, fetch_local=False)
                if not pending:
                    time.sleep(0.2)  # let Ray's dependency resolver finish with the task first
                    self._ray_cancel(payload)
                    return
        except Exception:  # the context shut down meanwhile
            pass

    @staticmethod
    def _ray_cancel(payload: Any) -> None:
        try:
            # A finished task keeps its result. Ray 2.60 can also abort the driver when cancel meets a task
            # whose result is already there but whose completion it has not processed yet (task_manager.cc
            # "Tried to complete task that was not pending"): never cancel a ref that is already ready.
            ready, _ = ray.wait([payload], timeout=0, fetch_local=False)
            if ready:
                return
            ray.cancel(payload, force=False, recursive=True)
        except Exception:  # already finished, or an object made by put: nothing to cancel
            pass

    def _shutdown(self) -> None:
        self._named.clear()
        groups, self._groups = self._groups, {}
        for pg in groups.values():  # the non-detached groups created here (removing one kills its members)
            try:
                remove_placement_group(pg)
            except Exception:  # removed already, or Ray is gone
                pass
        if self._owns_connection:
            _connect.release()


def _wait_until_dead(actors: list[Any], deadline: float) -> None:
    """ray.kill is asynchronous: a call made right after it can still reach the live worker and succeed (1 in 40
    fresh actors in raw Ray on this machine; a group member, every time in tests/ray). Probe each actor with
    Ray's built-in no-op method until the probe fails; from then on this driver's submitter knows the actor is
    dead and fails every later call with ActorDiedError. Past the deadline, give up quietly: the kill itself was
    requested."""
    while actors and time.monotonic() < deadline:
        probes = {actor.__ray_ready__.remote(): actor for actor in actors}
        done, pending = ray.wait(list(probes), num_returns=len(probes), timeout=max(0.0, deadline - time.monotonic()))
        if pending:
            return
        actors = [probes[probe] for probe in done if _answers(probe)]  # the kill has not reached these yet
        if actors:
            time.sleep(0.005)


def _answers(probe: Any) -> bool:
    try:
        ray.get(probe)
    except rex.RayActorError:
        return False
    return True


_remote.install_worker_context(functools.partial(RayJobContext, _attach_only=True))
