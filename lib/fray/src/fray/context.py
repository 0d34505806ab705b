"""The interface: JobContext (tasks, actors, objects). ClusterContext (whole jobs) is in fray.cluster_context.

The public methods here validate input and enforce the shared semantics; backends implement the hooks of
fray.runtime.hooks.JobContextHooks (each with its rule; docs/testing.md, "Writing a backend").
"""

from __future__ import annotations

import contextvars
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, cast

from fray._moved import moved_names
from fray.actor_pool import ActorPool
from fray.bounded_map import DEFAULT_IN_FLIGHT, bounded_map
from fray.errors import FrayError, UnsupportedFeatureError
from fray.executor import FrayExecutor
from fray.host.interrupts import interrupted
from fray.host.interrupts import refs as count_refs
from fray.runtime import current
from fray.runtime.arguments import (
    check_call,
    check_group_args,
    check_options,
    check_ref,
    check_timeout,
    check_wait_args,
    refuse_infeasible,
)
from fray.runtime.capabilities import Capability
from fray.runtime.completion import RefWatcher, get_with_progress, outcomes
from fray.runtime.current import clear_job_context
from fray.runtime.groups import PLACEMENTS, ActorGroup, admit_group, create_one_by_one
from fray.runtime.hooks import JobContextHooks
from fray.runtime.receive import receive
from fray.runtime.refs import ActorHandle, ObjectRef, async_methods
from fray.runtime.requests import GroupRequest, Resources, actor_request, task_request
from fray.runtime.streams import ObjectRefStream
from fray.telemetry import timeline
from fray.telemetry.event_store import EventStore
from fray.telemetry.events import RECORDER, RecordingChoice, not_recording, record_for_a_page
from fray.telemetry.progress import ProgressMode, check_mode
from fray.telemetry.timeline import TimelineSummary
from fray.telemetry.transfers import TransferReport, device_stats, merge, since
from fray.types import ActorOptions, Lifetime, TaskOptions

__all__ = ["JobContext", "clear_job_context", "get_job_context", "set_job_context"]


class JobContext(JobContextHooks):
    """Submit tasks, create actors, put and get objects. One per backend connection.

    Every blocking call takes a timeout; a task or actor method that raises makes `get` raise the original
    exception type. Use as a context manager to shut down on exit.
    """

    def __init__(self, *, owns_resources: bool = True, recording: RecordingChoice | None = None) -> None:
        """Backends call this first. owns_resources=False for a context a worker process has from its driver:
        shutting it down from inside a task is a no-op (the driver's context owns what it started). recording:
        its choice to record events (fray.telemetry.events.choose_recording), held until it shuts down."""
        self.owns_resources = owns_resources
        self._recording = recording
        self._shut_down = False
        self._shutdown_lock = threading.Lock()
        # request -> until when "it fits some node" is trusted (nodes can come and go)
        self._feasible: dict[tuple[tuple[str, float], ...], float] = {}
        self._watcher: RefWatcher | None = None  # made on first need (fray.runtime.completion)
        self._event_store = EventStore(self._pull_events)
        self._dashboard: Any = None  # its live page's server, once asked for (fray.dashboard)
        self._device_base = device_stats.snapshot()  # (this process's device loads before this context)

    @property
    def is_shut_down(self) -> bool:
        """shutdown() has been called (backend threads stop what they do for this context)."""
        return self._shut_down

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
        call_args, call_kwargs = check_call(args, kwargs)
        opts = check_options(options, TaskOptions)
        if opts.runtime_env is not None:
            if opts.runtime_env.env:
                self.require(Capability.TASK_ENV_VARS, "TaskOptions.runtime_env.env")
            if opts.runtime_env.package_requirements:
                self.require(Capability.TASK_PACKAGES, "TaskOptions.runtime_env.package_requirements")
        if opts.max_calls is not None:
            self.require(Capability.TASK_MAX_CALLS, "TaskOptions.max_calls")
        request = task_request(fn, opts)
        self._check_request(request.resources, "task", opts.name or getattr(fn, "__name__", fn))
        if opts.streaming:
            self.require(Capability.STREAMING, "TaskOptions(streaming=True)")
            return self._create_stream_task(fn, call_args, call_kwargs, request)  # type: ignore[return-value]
        return self._create_task(fn, call_args, call_kwargs, request)

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
        call_args, call_kwargs = check_call(args, kwargs)
        opts = check_options(options, ActorOptions)
        if opts.lifetime is Lifetime.DETACHED:
            self.require(Capability.DETACHED_ACTORS, "ActorOptions(lifetime=Lifetime.DETACHED)")
        self._require_async_actors(klass)
        request = actor_request(klass, opts)
        self._check_request(request.resources, "actor", request.name)
        return self._create_actor(klass, call_args, call_kwargs, request)

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
        check_group_args(klass, count, placement, PLACEMENTS)
        call_args, call_kwargs = check_call(args, kwargs)
        opts = check_options(options, ActorOptions)
        self._require_async_actors(klass)
        group = GroupRequest(actor_request(klass, opts), count, placement, bool(strict_placement), bool(distributed))
        existing = admit_group(self, klass, group)
        if existing is not None:
            return existing
        return self._create_actor_group(klass, call_args, call_kwargs, group)

    def get(
        self,
        refs: ObjectRef | Sequence[ObjectRef],
        timeout: float | None = None,
        progress: ProgressMode = False,
        out: Any = None,
    ) -> Any:
        """The value of a ref, or the values of a list of refs in order. Raises the task's exception: for a
        list, as soon as one of its refs has failed (the first failed one in list order), without waiting for
        the others, as Ray's get does. GetTimeoutError (a TimeoutError) when `timeout` seconds pass first.
        progress=True shows a progress bar of a list's refs on a terminal ("always": also when stderr is not
        one). out: tensors and arrays of the caller's (a `state_dict`; a list of them for a list of refs) that
        receive the value in place, and are returned (fray.runtime.receive)."""
        if out is not None:
            return receive(out, lambda: self.get(refs, timeout, progress))
        if self._shut_down:
            self._refuse_if_shut_down()
        seconds = check_timeout(timeout)  # (the whole call's: hooks take what is left of it, never more)
        try:
            if isinstance(refs, ObjectRef):
                if refs.backend != self.backend:  # (checked inline: an actor round trip's get: each step counts)
                    self._check_ref(refs)
                return self._get([refs], seconds)[0]
            if isinstance(refs, (list, tuple)):
                for index, ref in enumerate(refs):
                    if not isinstance(ref, ObjectRef) or ref.backend != self.backend:
                        self._check_ref(ref, index)
                if check_mode(progress) and refs:
                    return get_with_progress(self, list(refs), seconds, progress)
                return self._get(list(refs), seconds) if refs else []
        except KeyboardInterrupt as exc:  # Ctrl-C: the caller's frames and this one (fray.host.interrupts)
            raise interrupted(
                exc, f"ctx.get of {count_refs(1 if isinstance(refs, ObjectRef) else len(refs))}"
            ) from None
        raise ValueError(f"get needs an ObjectRef or a list of them, got {type(refs).__name__}")

    def wait(
        self, refs: Sequence[ObjectRef], num_returns: int = 1, timeout: float | None = None
    ) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """Block until `num_returns` of refs are complete (a failed task counts) or `timeout` passes.

        Returns (done, not_done), the same ref objects given, each list in input order; `done` holds at most
        num_returns refs (fewer after a timeout, which is not an error). Values are never fetched.
        """
        self._refuse_if_shut_down()
        check_wait_args(refs, num_returns, self.backend)
        seconds = check_timeout(timeout)
        if not refs:
            return [], []
        want = min(num_returns, len(refs))
        try:
            done_indices = self._wait(list(refs), want, seconds)
        except KeyboardInterrupt as exc:
            raise interrupted(exc, f"ctx.wait on {count_refs(len(refs))}") from None
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
        A running task is interrupted where the backend can (capability cancel_running; elsewhere
        UnsupportedFeatureError, and the task runs on); a finished task is left alone."""
        self._refuse_if_shut_down()
        self._check_ref(ref)
        if self._cancel(ref) is False:
            self.require(Capability.CANCEL_RUNNING, "cancel of a running task")

    def transfer_stats(self) -> TransferReport:
        """How the values read so far reached their readers, by path (see fray.telemetry.transfers): how many transfers,
        their bytes and seconds, summed over every process of this context that the backend can ask: a dict of
        path -> PathStats that prints as one line a path. Device values loaded in this process since this
        context began are counted by fray.runtime.cuda_values and fray.runtime.device_shares (`cuda-device-copy`,
        `cuda-staged`,
        `cuda-ipc`, ...)."""
        self._refuse_if_shut_down()
        return TransferReport(merge(self._transfer_stats(), since(device_stats.snapshot(), self._device_base)))

    def events(self) -> EventStore:
        """What this job did so far, from each of its processes that the backend can read (fray.telemetry.events): read
        afresh, kept in a bounded store that pages from a cursor."""
        self._refuse_if_shut_down()
        self._event_store.refresh()
        return self._event_store

    def timeline(self, path: str | os.PathLike[str]) -> TimelineSummary:
        """Write what this job did so far as a Chrome trace / Perfetto JSON file (fray.telemetry.timeline: spans of
        tasks, actor calls and transfers, submit-to-start arrows, deaths and restarts); open it in ui.perfetto.dev."""
        summary = timeline.write(path, self.events().by_process())
        if not RECORDER.enabled:
            warnings.warn(not_recording(f"the timeline {summary.path}"), RuntimeWarning, stacklevel=2)
        return summary

    def dashboard(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Start this job's live page (docs/dashboard.md) if it is not running, and return its URL, which holds
        the page's access token: keep it private. Loopback only unless `host` says otherwise; stops at shutdown."""
        with self._shutdown_lock:
            self._refuse_if_shut_down()
            if self._dashboard is None:
                from fray.dashboard import Dashboard
                from fray.dashboard.job_page import JobPage

                self._dashboard = Dashboard(JobPage(self, record_for_a_page(self._recording)), host, port)
            url: str = self._dashboard.url
            return url

    def executor(self, max_workers: int | None = None, **task_options: Any) -> FrayExecutor:
        """A concurrent.futures.Executor whose submits are tasks with these TaskOptions (fray.executor): at most
        `max_workers` on the backend at once (default: twice what the cluster runs together, at least 32), the
        rest queued in it."""
        self._refuse_if_shut_down()
        return FrayExecutor(self, TaskOptions(**task_options), max_workers)

    def map(
        self,
        fn: Callable[..., Any],
        iterable: Iterable[Any],
        *,
        max_in_flight: int | None = None,
        ordered: bool = True,
        progress: ProgressMode = False,
        **task_options: Any,
    ) -> Iterator[Any]:
        """fn(item) as a task per item, read lazily with at most `max_in_flight` submitted (default 1000);
        results in order, or as they finish (ordered=False). A failed item raises its own exception, noted with
        its index (`exc.item_index`). fray.bounded_map."""
        self._refuse_if_shut_down()
        window = DEFAULT_IN_FLIGHT if max_in_flight is None else max_in_flight
        return bounded_map(self, fn, iterable, window, ordered, progress, TaskOptions(**task_options))

    def actor_pool(self, klass: type, size: int, *args: Any, **actor_options: Any) -> ActorPool:
        """`size` actors klass(*args) with these ActorOptions, fed by the pool's map and submit (fray.actor_pool)."""
        self._refuse_if_shut_down()
        return ActorPool(self, klass, size, args, {}, ActorOptions(**actor_options))

    def shutdown(self) -> None:
        """Release everything this context started. Idempotent. Every later call raises FrayError.

        A no-op for a context code runs under inside a task or actor (a worker's, or in_memory's driver context
        lent to the task): what that context started belongs to its driver."""
        if not self.owns_resources or current.lent(self):
            return
        current.forget(self)
        with self._shutdown_lock:
            if self._shut_down:
                return
            self._shut_down = True
        if self._dashboard is not None:
            self._dashboard.stop()
        self._shutdown()
        if self._recording is not None:
            self._recording.release()

    def _refuse_if_shut_down(self) -> None:
        if self._shut_down:
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

    def _require_async_actors(self, klass: type) -> None:
        if Capability.ASYNC_ACTORS not in self.capabilities:
            methods = async_methods(klass)
            if methods:
                self.require(
                    Capability.ASYNC_ACTORS, f"the async def methods of {klass.__name__} ({', '.join(sorted(methods))})"
                )

    def check_feasible(self, request: Mapping[str, float], what: str) -> None:
        """Refuse at submission a request that no node could ever satisfy (engines would wait forever)."""
        if request:
            refuse_infeasible(self._feasible, self.node_resources, tuple(request.items()), what, self.backend)

    def _check_request(self, resources: Resources, kind: str, name: object) -> None:
        """check_feasible of a call's request, its description made only when it is refused."""
        if resources:
            refuse_infeasible(self._feasible, self.node_resources, resources, lambda: f"{kind} {name!s}", self.backend)

    def _check_ref(self, ref: Any, index: int | None = None) -> None:
        check_ref(ref, self.backend, index)

    def _check_handle(self, handle: ActorHandle) -> None:
        if handle.backend != self.backend:
            raise ValueError(f"{handle!r} belongs to the {handle.backend!r} backend, not {self.backend!r}")

    def _call_actor_checked(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRef:
        if self._shut_down:
            self._refuse_if_shut_down()
        if handle.backend != self.backend:
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

    # ----------------------------------------------------------------- hooks whose default needs the context
    def _create_actor_group(
        self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], group: GroupRequest
    ) -> ActorGroup:
        """Create `group.count` members together, all or nothing, placed as asked (best effort unless strict); for
        a distributed group each in a process of its own with the torch.distributed environment set before
        __init__. Default: members one by one through `_create_actor(..., member=...)`."""
        return create_one_by_one(self, klass, args, kwargs, group)

    def _future(self, ref: ObjectRef) -> Future[Any]:
        """A concurrent.futures.Future of ref's value. Default: settled when its outcome is (no thread of its
        own)."""
        return outcomes(self, [ref])[0].to_future(lambda _: self._get([ref], None)[0])


def get_job_context() -> JobContext:
    """The job context of this task, actor, or thread; else the process default (set by fray.init).

    With neither, the default is created from FRAY_BACKEND (in_memory when unset), as Ray auto-initializes.
    """
    return cast(JobContext, current.get_job_context())  # fray.runtime.current holds JobContexts, typed as it needs them


def set_job_context(ctx: JobContext) -> contextvars.Token[JobContext | None]:
    """Make ctx current for this thread/task (and the process default if there is none yet)."""
    if not isinstance(ctx, JobContext):
        raise TypeError(f"set_job_context needs a JobContext, got {type(ctx).__name__}")
    return cast("contextvars.Token[JobContext | None]", current.set_current(ctx))


__getattr__ = moved_names(__name__, {"ClusterContext": "fray.cluster_context"})  # (its path before, for a release)
