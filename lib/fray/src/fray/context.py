"""The interface: JobContext (tasks, actors, objects) and ClusterContext (whole jobs), plus the current context.

The public methods here validate input and enforce the shared semantics; backends implement the `_hooks`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, TypeVar

from fray import current
from fray.capabilities import Capability
from fray.current import ActorInfo, clear_job_context, get_job_context, set_job_context
from fray.errors import (
    ActorAlreadyExistsError,
    ActorNotFoundError,
    FrayError,
    GetTimeoutError,
    InfeasibleResourcesError,
    UnsupportedFeatureError,
)
from fray.groups import PLACEMENTS, ActorGroup, Member, check_group_feasible, free_port, member_name, spmd_env
from fray.progress import Progress, ProgressMode, check_mode
from fray.refs import ActorHandle, ObjectRef
from fray.streams import ObjectRefStream
from fray.transfers import PathStats
from fray.types import ActorOptions, JobInfo, Lifetime, RuntimeEnv, TaskOptions, normalize_resources

__all__ = [
    "ClusterContext",
    "JobContext",
    "clear_job_context",
    "get_job_context",
    "set_job_context",
]

T = TypeVar("T")


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    return float(timeout)


def _check_call(args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list, got {type(args).__name__} (did you mean args=(x,)?)")
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    return tuple(args), dict(kwargs)


_DEFAULTS: dict[type, Any] = {TaskOptions: TaskOptions(), ActorOptions: ActorOptions()}  # frozen: safe to share
_FEASIBLE_SECONDS = 5.0  # how long a "this request fits some node" answer is reused (nodes can come and go)


def _check_options(options: Any, cls: type[T]) -> T:
    if options is None:
        return _DEFAULTS[cls]  # type: ignore[no-any-return]
    if not isinstance(options, cls):
        raise TypeError(f"options must be a fray.{cls.__name__}, got {type(options).__name__}")
    return options


def task_resources(options: TaskOptions) -> dict[str, float]:
    """What a task holds while it runs: 1 CPU unless it says otherwise (as in Ray), raised to its runtime_env's
    minimum_resources; a request above its maximum_resources is a ValueError."""
    env = options.runtime_env
    if options.resources is None and (env is None or not (env.minimum_resources or env.maximum_resources)):
        return {"CPU": 1.0}
    requested = normalize_resources(options.resources)
    if options.resources is None or "CPU" not in options.resources:
        requested = {"CPU": 1.0, **requested}
    if env is not None:
        for res in env.minimum_resources:
            requested[res.name] = max(requested.get(res.name, 0.0), float(res.quantity))
        for res in env.maximum_resources:
            if requested.get(res.name, 0.0) > res.quantity:
                raise ValueError(
                    f"the task requests {res.name}={requested[res.name]:g}, above its runtime_env's maximum "
                    f"{res.name}={res.quantity:g}"
                )
    return requested


def actor_resources(options: ActorOptions) -> dict[str, float]:
    """What an actor holds for its whole life: only what it asks for (as Ray actors hold 0 CPU by default)."""
    return normalize_resources(options.resources)


class JobContext(ABC):
    """Submit tasks, create actors, put and get objects. One per backend connection.

    Every blocking call takes a timeout; a task or actor method that raises makes `get` raise the original
    exception type. Use as a context manager to shut down on exit.
    """

    backend: ClassVar[str] = "?"
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    # False for a context a worker borrows from its driver: shutting it down from inside a task is a no-op
    shutdown_closes: ClassVar[bool] = True

    # ----------------------------------------------------------------- public API
    def create_task(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: TaskOptions | None = None,
    ) -> ObjectRef:
        """Run fn(*args, **kwargs) somewhere; return a ref to its result. ObjectRefs among the top-level args
        arrive as their values (the task starts once they are ready); refs nested in containers arrive as refs."""
        self._refuse_if_shut_down()
        if not callable(fn):
            raise TypeError(f"create_task needs a callable, got {type(fn).__name__}")
        if isinstance(fn, type):
            raise TypeError(f"create_task got the class {fn.__name__}; use create_actor for classes")
        call_args, call_kwargs = _check_call(args, kwargs)
        opts = _check_options(options, TaskOptions)
        if opts.runtime_env is not None:
            if opts.runtime_env.env:
                self.require(Capability.TASK_ENV_VARS, "TaskOptions.runtime_env.env")
            if opts.runtime_env.package_requirements:
                self.require(Capability.TASK_PACKAGES, "TaskOptions.runtime_env.package_requirements")
        self.check_feasible(task_resources(opts), f"task {opts.name or getattr(fn, '__name__', fn)!s}")
        if opts.streaming:
            self.require(Capability.STREAMING, "TaskOptions(streaming=True)")
            return self._create_stream_task(fn, call_args, call_kwargs, opts)  # type: ignore[return-value]
        return self._create_task(fn, call_args, call_kwargs, opts)

    def create_actor(
        self,
        klass: type,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: ActorOptions | None = None,
    ) -> ActorHandle:
        """Create an instance of klass that lives in one place; call its methods through the handle."""
        self._refuse_if_shut_down()
        if not isinstance(klass, type):
            raise TypeError(f"create_actor needs a class, got {type(klass).__name__}")
        call_args, call_kwargs = _check_call(args, kwargs)
        opts = _check_options(options, ActorOptions)
        if opts.lifetime is Lifetime.DETACHED:
            self.require(Capability.DETACHED_ACTORS, "ActorOptions(lifetime=Lifetime.DETACHED)")
        self.check_feasible(actor_resources(opts), f"actor {opts.name or klass.__name__}")
        return self._create_actor(klass, call_args, call_kwargs, opts)

    def create_actor_group(
        self,
        klass: type,
        count: int,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: ActorOptions | None = None,
        placement: str = "pack",
        strict_placement: bool = False,
        distributed: bool = False,
    ) -> ActorGroup:
        """Create `count` actors of klass together (all or nothing): an ActorGroup whose calls go to every member.

        options apply to every member (options.name names the group; members are found as "name/rank").
        placement "pack" puts members on as few nodes as possible, "spread" over nodes: best effort unless
        strict_placement. distributed=True gives each member its own process with MASTER_ADDR, MASTER_PORT, RANK,
        WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set before __init__, for torch.distributed.
        """
        self._refuse_if_shut_down()
        if not isinstance(klass, type):
            raise TypeError(f"create_actor_group needs a class, got {type(klass).__name__}")
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an int, got {count!r}")
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(map(repr, PLACEMENTS))}, got {placement!r}")
        call_args, call_kwargs = _check_call(args, kwargs)
        opts = _check_options(options, ActorOptions)
        if opts.lifetime is Lifetime.DETACHED:
            self.require(Capability.DETACHED_ACTORS, "ActorOptions(lifetime=Lifetime.DETACHED)")
        if distributed:
            self.require(Capability.SPMD_GROUPS, "create_actor_group(distributed=True)")
        if opts.name is not None:
            existing = self._existing_group(opts.name, count, opts.get_if_exists)
            if existing is not None:
                return existing
        what = f"actor group {opts.name or klass.__name__}"
        check_group_feasible(
            self.node_resources(), actor_resources(opts), count, placement, bool(strict_placement), what
        )
        return self._create_actor_group(
            klass, count, call_args, call_kwargs, opts, placement, bool(strict_placement), bool(distributed)
        )

    def _existing_group(self, name: str, count: int, get_if_exists: bool) -> ActorGroup | None:
        try:
            first = self._get_actor(member_name(name, 0) or "")
        except ActorNotFoundError:
            return None
        if not get_if_exists:
            raise ActorAlreadyExistsError(
                f"an actor group named {name!r} exists already; pass ActorOptions(get_if_exists=True) to reuse it, "
                "or pick another name"
            )
        handles = [first]
        try:
            handles += [self._get_actor(member_name(name, rank) or "") for rank in range(1, count)]
        except ActorNotFoundError as exc:
            raise ActorNotFoundError(
                f"the actor group {name!r} has lost members or has fewer than {count}: {exc}"
            ) from None
        try:
            self._get_actor(member_name(name, count) or "")
        except ActorNotFoundError:
            return ActorGroup(handles, name, ctx=self)
        raise ValueError(f"the actor group {name!r} has more than {count} members; ask for its real size")

    def get(
        self, refs: ObjectRef | Sequence[ObjectRef], timeout: float | None = None, progress: ProgressMode = False
    ) -> Any:
        """The value of a ref, or the values of a list of refs in order. Raises the task's exception: for a
        list, as soon as one of its refs has failed (the first failed one in list order), without waiting for
        the others, as Ray's get does. GetTimeoutError (a TimeoutError) when `timeout` seconds pass first.
        progress=True shows a progress bar of a list's refs on a terminal ("always": also when stderr is not
        one)."""
        self._refuse_if_shut_down()
        deadline = _check_timeout(timeout)
        if isinstance(refs, ObjectRef):
            self._check_ref(refs)
            return self._get([refs], deadline)[0]
        if isinstance(refs, (list, tuple)):
            for ref in refs:
                self._check_ref(ref)
            if check_mode(progress) and refs:
                return self._get_with_progress(list(refs), deadline, progress)
            return self._get(list(refs), deadline) if refs else []
        raise ValueError(f"get needs an ObjectRef or a list of them, got {type(refs).__name__}")

    def _get_with_progress(self, refs: list[ObjectRef], timeout: float | None, mode: ProgressMode) -> list[Any]:
        """get, fetching each ref as it completes to count it (and its failure) on the bar; a failure is raised
        when it is seen (the first in input order among those seen together), as get does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        values: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        pending = list(range(len(refs)))
        with Progress(len(refs), mode, "fray.get") as bar:
            while pending:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                done = self._wait([refs[i] for i in pending], 1, left)
                if not done:
                    raise GetTimeoutError(f"get timed out after {timeout} s: {len(pending)} of {len(refs)} not ready")
                finished = [pending[j] for j in sorted(done)]
                failed = 0
                for i in finished:
                    try:
                        values[i] = self._get([refs[i]], None)[0]
                    except Exception as exc:  # raised below, in input order
                        errors[i] = exc
                        failed += 1
                bar.advance(len(finished), failed)
                if errors:
                    raise errors[min(errors)]
                done_set = set(finished)
                pending = [i for i in pending if i not in done_set]
        return [values[i] for i in range(len(refs))]

    def wait(
        self, refs: Sequence[ObjectRef], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """Block until `num_returns` of refs are complete (a failed task counts) or `timeout` passes.

        Returns (done, not_done), the same ref objects given, each list in input order; `done` holds at most
        num_returns refs (fewer after a timeout, which is not an error). Values are never fetched.
        """
        self._refuse_if_shut_down()
        if isinstance(refs, ObjectRef) or not isinstance(refs, (list, tuple)):
            raise ValueError(f"wait needs a list of ObjectRefs, got {type(refs).__name__}")
        if isinstance(num_returns, bool) or not isinstance(num_returns, int):
            raise TypeError(f"num_returns must be an int, got {num_returns!r}")
        if num_returns < 1:
            raise ValueError(f"num_returns must be >= 1, got {num_returns}")
        deadline = _check_timeout(timeout)
        seen: set[ObjectRef] = set()
        for ref in refs:
            self._check_ref(ref)
            if ref in seen:
                raise ValueError(f"wait got the same ref twice: {ref!r}")
            seen.add(ref)
        if not refs:
            return [], []
        want = min(num_returns, len(refs))
        done_indices = self._wait(list(refs), want, deadline)
        chosen = set(sorted(done_indices)[:want])
        done = [ref for i, ref in enumerate(refs) if i in chosen]
        not_done = [ref for i, ref in enumerate(refs) if i not in chosen]
        return done, not_done

    def put(self, obj: Any) -> ObjectRef:
        """Store a copy of obj; later changes to obj do not change what get returns."""
        self._refuse_if_shut_down()
        if isinstance(obj, ObjectRef):
            raise TypeError("put of an ObjectRef: pass the ref itself instead of putting it")
        return self._put(obj)

    def get_actor(self, name: str) -> ActorHandle:
        """The live actor with this name; ActorNotFoundError if none."""
        self._refuse_if_shut_down()
        if not isinstance(name, str) or not name:
            raise TypeError(f"actor name must be a non-empty str, got {name!r}")
        return self._get_actor(name)

    def kill(self, actor: ActorHandle | ActorGroup) -> None:
        """Stop the actor (every member of a group) now, with no restart. Later calls raise ActorDiedError;
        names are freed."""
        self._refuse_if_shut_down()
        if isinstance(actor, ActorGroup):
            for handle in actor.handles:
                self._check_handle(handle)
            self._kill_group(actor)
            return
        if not isinstance(actor, ActorHandle):
            raise TypeError(f"kill needs an ActorHandle or an ActorGroup, got {type(actor).__name__}")
        self._check_handle(actor)
        self._kill(actor)

    def cancel(self, ref: ObjectRef) -> None:
        """Cancel the task behind ref: a queued task never runs; `get` then raises TaskCancelledError.
        A running task is interrupted where the backend can (capability cancel_running); a finished task is
        left alone."""
        self._refuse_if_shut_down()
        self._check_ref(ref)
        self._cancel(ref)

    def transfer_stats(self) -> dict[str, PathStats]:
        """How the values read so far reached their readers, by path (see fray.transfers): how many transfers,
        their bytes and seconds, summed over every process of this context that the backend can ask."""
        self._refuse_if_shut_down()
        return self._transfer_stats()

    def shutdown(self) -> None:
        """Release everything this context started. Idempotent. Every later call raises FrayError."""
        if self.shutdown_closes:
            self.__dict__["_fray_shut_down"] = True
        current.forget(self)
        self._shutdown()

    def _refuse_if_shut_down(self) -> None:
        if self.__dict__.get("_fray_shut_down"):
            raise FrayError(f"this {self.backend} context is shut down; create a new one with fray.init()")

    def __enter__(self) -> JobContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __reduce__(self) -> tuple[Any, ...]:
        # A context captured by a task or actor (a closure, an attribute) arrives as the context current where
        # it lands, as refs and handles do: a connection cannot travel, and the one there is the same job's.
        return (current.context_for, (self.backend,))

    # ----------------------------------------------------------------- helpers for backends
    def require(self, capability: Capability, used: str = "") -> None:
        if capability not in self.capabilities:
            detail = f"{used} needs it" if used else ""
            raise UnsupportedFeatureError(capability, self.backend, detail)

    def check_feasible(self, request: Mapping[str, float], what: str) -> None:
        """Refuse at submission a request that no node could ever satisfy (engines would wait forever)."""
        if not request:
            return
        key = tuple(request.items())  # the same request built the same way hits; another order just misses
        cache: dict[tuple[tuple[str, float], ...], float] = self.__dict__.setdefault("_fray_feasible", {})
        now = time.monotonic()
        if cache.get(key, 0.0) > now:
            return
        nodes = self.node_resources()
        for node in nodes:
            if all(node.get(name, 0.0) >= qty for name, qty in request.items()):
                if len(cache) > 256:
                    cache.clear()
                cache[key] = now + _FEASIBLE_SECONDS
                return
        largest = max(nodes, key=lambda n: n.get("CPU", 0.0)) if nodes else {}
        raise InfeasibleResourcesError(
            f"{what} requests {dict(request)} but no node of this {self.backend} context has that much "
            f"(largest node: {_format_resources(largest)}). Lower the request or add nodes with those resources."
        )

    def _check_ref(self, ref: Any) -> None:
        if not isinstance(ref, ObjectRef):
            raise ValueError(f"expected an ObjectRef, got {type(ref).__name__}")
        if ref.backend != self.backend:
            raise ValueError(f"{ref!r} belongs to the {ref.backend!r} backend, not to this {self.backend!r} context")

    def _check_handle(self, handle: ActorHandle) -> None:
        if handle.backend != self.backend:
            raise ValueError(f"{handle!r} belongs to the {handle.backend!r} backend, not {self.backend!r}")

    def _call_actor_checked(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRef:
        self._refuse_if_shut_down()
        self._check_handle(handle)
        return self._call_actor(handle, method, args, kwargs)

    def _call_actor_stream_checked(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        self._refuse_if_shut_down()
        self._check_handle(handle)
        self.require(Capability.STREAMING, f"{handle.class_name}.{method}.stream(...)")
        return self._call_actor_stream(handle, method, args, kwargs)

    def _call_group_checked(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]:
        self._refuse_if_shut_down()
        self._check_handle(group.handles[0])
        return self._call_group(group, method, args, kwargs)

    def _future_of(self, ref: ObjectRef) -> Future[Any]:
        self._refuse_if_shut_down()
        self._check_ref(ref)
        return self._future(ref)

    @staticmethod
    def _spmd_members(count: int, name: str | None, distributed: bool) -> list[Member]:
        """The members of a group all on this host (the default placement): ranks, and for an SPMD group the
        torch.distributed environment with rank 0's address on loopback."""
        port = free_port() if distributed else 0
        return [
            Member(
                ActorInfo(member_name(name, rank), rank, count, name),
                distributed,
                spmd_env(rank, count, "127.0.0.1", port) if distributed else {},
            )
            for rank in range(count)
        ]

    # ----------------------------------------------------------------- backend hooks
    @abstractmethod
    def node_resources(self) -> list[dict[str, float]]:
        """The total resources of each node (for feasibility checks)."""

    @abstractmethod
    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRef: ...

    @abstractmethod
    def _create_actor(
        self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], options: ActorOptions
    ) -> ActorHandle: ...

    @abstractmethod
    def _call_actor(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRef: ...

    @abstractmethod
    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        """Values in order; raise the first failed ref's exception, GetTimeoutError after timeout (total)."""

    @abstractmethod
    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        """Indices of refs that are complete: at least num_returns of them unless the timeout passed."""

    @abstractmethod
    def _put(self, obj: Any) -> ObjectRef: ...

    @abstractmethod
    def _get_actor(self, name: str) -> ActorHandle: ...

    @abstractmethod
    def _kill(self, handle: ActorHandle) -> None: ...

    @abstractmethod
    def _cancel(self, ref: ObjectRef) -> None: ...

    @abstractmethod
    def _shutdown(self) -> None: ...

    def _transfer_stats(self) -> dict[str, PathStats]:
        return {}

    # Hooks with a default: a backend overrides them where it can do better (one broadcast for a group call).
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
        """Members one by one through `_create_actor(..., member=...)` (a backend that accepts `member`); if one
        cannot be created, the ones created are killed."""
        handles: list[ActorHandle] = []
        try:
            for member in self._spmd_members(count, options.name, distributed):
                member_options = dataclasses.replace(options, name=member.info.name, get_if_exists=False)
                handles.append(self._create_actor(klass, args, kwargs, member_options, member=member))  # type: ignore[call-arg]
        except BaseException:
            for handle in handles:
                try:
                    self._kill(handle)
                except Exception:  # the creation error is the one to report
                    pass
            raise
        return ActorGroup(handles, options.name, ctx=self)

    def _call_group(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]:
        return [self._call_actor(handle, method, args, kwargs) for handle in group.handles]

    def _kill_group(self, group: ActorGroup) -> None:
        for handle in group.handles:
            self._kill(handle)

    def _create_stream_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRefStream:
        raise UnsupportedFeatureError(Capability.STREAMING, self.backend, "TaskOptions(streaming=True)")

    def _call_actor_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        raise UnsupportedFeatureError(Capability.STREAMING, self.backend, f"{handle.class_name}.{method}.stream()")

    def _future(self, ref: ObjectRef) -> Future[Any]:
        """A Future of ref's value: by default a thread that waits in `_get` (backends with callbacks do better)."""
        future: Future[Any] = Future()

        def settle() -> None:
            try:
                future.set_result(self._get([ref], None)[0])
            except BaseException as exc:  # the future carries it to whoever awaits
                future.set_exception(exc)

        threading.Thread(target=settle, name=f"fray-future-{ref!r}"[:60], daemon=True).start()
        return future


def _format_resources(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


class ClusterContext(ABC):
    """Run whole programs (jobs) as commands, watch their status, follow and read their logs, stop them."""

    backend: ClassVar[str] = "?"
    # What this context can do; a backend's class declares it, and one context may have less than its class (a
    # Ray head private to this process keeps no job once this process ends: no persistent_jobs).
    capabilities: frozenset[Capability] = frozenset()
    # Where jobs run when create_job is given no working_dir: None means the caller's current directory.
    default_working_dir: str | None = None

    def create_job(
        self,
        entrypoint: str | Sequence[str],
        env: RuntimeEnv | None = None,
        working_dir: str | os.PathLike[str] | None = None,
        detached: bool = False,
    ) -> str:
        """Start `entrypoint` (a shell command string, or an argv list run without a shell); return its id.

        working_dir: the directory the job runs in (default: the caller's current directory). On this machine the
        job runs in place there; a backend whose jobs run elsewhere sends the directory along (Ray's working_dir).
        detached: the job outlives this process and this context, and any process can find it (list, logs, stop,
        delete); needs the persistent_jobs capability. A job that is not detached ends when its owner ends,
        however the owner ends, unless it runs on a cluster the user started (whose jobs outlive their submitter).
        """
        if isinstance(entrypoint, str):
            if not entrypoint.strip():
                raise ValueError("entrypoint must not be empty")
        elif isinstance(entrypoint, (list, tuple)):
            if not entrypoint or not all(isinstance(a, str) for a in entrypoint):
                raise TypeError("an argv entrypoint must be a non-empty list of strings")
            entrypoint = list(entrypoint)
        else:
            raise TypeError(f"entrypoint must be a str or a list of str, got {type(entrypoint).__name__}")
        if env is not None and not isinstance(env, RuntimeEnv):
            raise TypeError(f"env must be a fray.RuntimeEnv, got {type(env).__name__}")
        if env is not None and env.package_requirements and Capability.JOB_PACKAGES not in self.capabilities:
            raise UnsupportedFeatureError(Capability.JOB_PACKAGES, self.backend, "RuntimeEnv.package_requirements")
        if env is not None and env.maximum_resources:
            raise ValueError(
                "RuntimeEnv.maximum_resources bounds a task's request; no backend can cap a whole job's usage. "
                "Use minimum_resources to reserve resources for the job."
            )
        if env is not None and env.minimum_resources and Capability.JOB_RESOURCES not in self.capabilities:
            raise UnsupportedFeatureError(Capability.JOB_RESOURCES, self.backend, "RuntimeEnv.minimum_resources")
        if not isinstance(detached, bool):
            raise TypeError(f"detached must be True or False, got {detached!r}")
        if detached and Capability.PERSISTENT_JOBS not in self.capabilities:
            why = f"create_job(detached=True) needs it: {self._no_persistent_jobs()}"
            raise UnsupportedFeatureError(Capability.PERSISTENT_JOBS, self.backend, why)
        if working_dir is None:
            working_dir = self.default_working_dir or os.getcwd()
        elif not isinstance(working_dir, (str, os.PathLike)):
            raise TypeError(f"working_dir must be a path (str or os.PathLike), got {type(working_dir).__name__}")
        directory = os.path.abspath(os.fspath(working_dir))
        if not os.path.isdir(directory):
            raise ValueError(f"working_dir {directory!r} is not a directory")
        return self._create_job(entrypoint, env or RuntimeEnv(), directory, detached)

    def list_jobs(self) -> list[JobInfo]:
        """Every job this context can see, oldest first where the backend knows the order."""
        return self._list_jobs()

    def get_job(self, job_id: str) -> JobInfo:
        """The current JobInfo of one job (JobNotFoundError if unknown)."""
        return self._get_job(job_id)

    def stop_job(self, job_id: str) -> None:
        """Stop a pending or running job (its whole process group: SIGTERM, then SIGKILL after a grace period) and
        return once it has ended. It ends STOPPED and stays listed, with its logs. A job that has already ended is
        left as it is."""
        self._stop_job(job_id)

    def delete_job(self, job_id: str) -> None:
        """Stop the job if it runs (its whole process group), then forget it."""
        self._delete_job(job_id)

    def get_job_logs(self, job_id: str) -> str:
        """Everything the job wrote to stdout and stderr so far (readable while it runs and after)."""
        return self._get_job_logs(job_id)

    def tail_job_logs(self, job_id: str) -> Iterator[str]:
        """Follow the job's output: an iterator of text pieces, first what the job wrote so far, then each new
        piece as it comes; it ends once the job has ended and everything it wrote has been given. Joined, the
        pieces are the job's whole log. Unknown ids raise JobNotFoundError here, not at the first piece."""
        self._get_job(job_id)
        return self._tail_job_logs(job_id)

    def wait_job(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """Block until the job ends; GetTimeoutError after timeout."""
        return self._wait_job(job_id, _check_timeout(timeout))

    def node_status(self) -> list[dict[str, Any]]:
        """The nodes jobs run on, as far as this context can see them: `{"node": name, "total": {resource:
        quantity}, "free": {...}}` each (resource names as in node_resources). Empty where it cannot tell."""
        return []

    def running_work(self) -> dict[str, list[dict[str, Any]]] | None:
        """Tasks running and actors alive on the cluster, where another process can see them: `{"tasks":
        [{"name", "state", "node"}...], "actors": [{"name", "class", "state", "node"}...]}`; None where it cannot
        (in_memory and monarch tasks live inside their own driver)."""
        return None

    def shutdown(self) -> None:
        """Release what this context started: its jobs that are not detached end; detached ones go on."""
        self._shutdown()

    def __enter__(self) -> ClusterContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ----------------------------------------------------------------- backend hooks
    @abstractmethod
    def _create_job(self, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str, detached: bool) -> str:
        """Start the job in working_dir (an absolute path that exists here); detached only with persistent_jobs."""

    @abstractmethod
    def _list_jobs(self) -> list[JobInfo]: ...

    @abstractmethod
    def _get_job(self, job_id: str) -> JobInfo: ...

    @abstractmethod
    def _stop_job(self, job_id: str) -> None: ...

    @abstractmethod
    def _delete_job(self, job_id: str) -> None: ...

    @abstractmethod
    def _get_job_logs(self, job_id: str) -> str: ...

    @abstractmethod
    def _wait_job(self, job_id: str, timeout: float | None) -> JobInfo: ...

    @abstractmethod
    def _shutdown(self) -> None: ...

    def _tail_job_logs(self, job_id: str) -> Iterator[str]:
        """Default: poll the status, then the logs, and give what is new (polls 20 times a second at first, then
        down to twice a second while nothing comes). Backends with a log file of their own do better."""
        shown, pause = 0, 0.05
        while True:
            ended = self._get_job(job_id).status.is_terminal  # before reading: what it wrote before ending is read
            logs = self._get_job_logs(job_id)
            if len(logs) > shown:
                yield logs[shown:]
                shown, pause = len(logs), 0.05
            if ended:
                return
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    def _no_persistent_jobs(self) -> str:
        """Why this context keeps no job beyond its owner's life (for the persistent_jobs refusal)."""
        return f"the {self.backend} backend's jobs live in the processes of the program that submitted them"

    def _tie_job(self, job_id: str) -> None:
        """Make a detached job end when this process ends, however it ends (what a job that is not detached
        does), while keeping it reachable from other processes: `fray job submit` waiting for a job. Default: no
        way to (a cluster the user started keeps its jobs)."""
        return None

    def _untie_job(self, job_id: str) -> None:
        """Undo _tie_job (the job has ended, or is left running on purpose)."""
        return None
