"""RayJobContext: fray's JobContext on Ray tasks, actors and the object store.

Payloads: an ObjectRef's payload is a ray.ObjectRef; an ActorHandle's payload is a Ray actor handle. Both
pickle through Ray's own serializer (with its reference counting), so refs and handles can be passed into tasks.

The context does tasks, streams, objects and futures itself, and hands the rest to collaborators it makes:
`_actors.RayActors` (create, find, kill; named actors), `_groups.RayGroups` (placement groups) and
`_cancel.CancelTracker` (cancel without Ray 2.60's driver aborts); `_args` converts arguments.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ClassVar

import ray

from fray.backend import (
    SHARED,
    STAGED,
    ActorGroup,
    ActorHandle,
    ActorRequest,
    Capability,
    GroupRequest,
    JobContext,
    Kind,
    Member,
    ObjectRef,
    ObjectRefStream,
    PathStats,
    ProcessEvents,
    RecordingChoice,
    TaskRequest,
    check_function,
    find_unserializable_argument,
)
from fray.errors import ActorUnavailableError, SerializationError, TaskCancelledError
from fray_ray import _connect, _events, _remote
from fray_ray._actors import RayActors
from fray_ray._args import hold_shares, is_serialization_error, unwrap_args, unwrap_kwargs
from fray_ray._cancel import CancelTracker
from fray_ray._driver_events import generator_ref, submitted, task_name
from fray_ray._groups import RayGroups
from fray_ray._refusals import raise_refusals
from fray_ray._remote import Registry, registered_callable
from fray_ray._resend import remaining
from fray_ray._streams import RayStreamSource
from fray_ray._transfer_counts import TransferCounts
from fray_ray._translate import is_default_task, task_options, translate, worker_calls
from fray_ray._values import known_nbytes, pack, take_unpacked_bytes

BACKEND = "ray"
_registry = Registry()
_stream_registry = Registry()  # generator-task registrations (num_returns="streaming"), apart from plain ones
_checked_functions: dict[int, Any] = {}
_SWEEP_MIN = 64  # refs left after a wait from which _wait also collects the other completed ones


class RayJobContext(JobContext):
    """A JobContext on Ray. See docs/backends/ray.md for the options and behaviour."""

    backend: ClassVar[str] = BACKEND
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.DETACHED_ACTORS,
            Capability.TASK_ENV_VARS,
            Capability.TASK_PACKAGES,
            Capability.TASK_MAX_CALLS,  # _remote.py: ray.remote(max_calls=N), one registration per value
            Capability.CANCEL_RUNNING,
            Capability.STREAMING,
            Capability.SPMD_GROUPS,
            Capability.SPMD_GANG_RESTART,  # _gangs.py
            Capability.SPMD_HANG_DETECTION,  # _gangs.py: heartbeats in Ray's KV
            Capability.ASYNC_ACTORS,
            Capability.PROCESS_ISOLATION,
            Capability.MULTI_HOST,
            Capability.ZERO_COPY_OBJECTS,
            Capability.DEVICE_SHARES,  # a private instance's (device_mode below); a joined cluster's are staged
        }
    )

    def __init__(
        self,
        address: str | None = None,
        namespace: str | None = None,
        log_to_driver: bool = True,
        _attach_only: bool = False,
        _recording: RecordingChoice | None = None,
        **init_kwargs: Any,
    ) -> None:
        """address: "host:port" of a running cluster (else RAY_ADDRESS; else a private local instance sized by
        init_kwargs: num_cpus, num_gpus, object_store_memory, resources). _attach_only: inside a Ray worker.
        _recording: the driver's choice to record events (fray.telemetry.events.choose_recording)."""
        super().__init__(owns_resources=not _attach_only, recording=_recording)  # (a worker's: its driver's)
        self._owns_connection = not _attach_only
        if self._owns_connection:
            _connect.acquire(address, namespace, init_kwargs, log_to_driver)
        self.namespace: str = ray.get_runtime_context().namespace
        # A driver on a private instance (every worker on this host) sends a call's device values as shares of
        # its snapshots, held until the call is done (fray.runtime.device_shares); elsewhere their bytes travel.
        self.device_mode = SHARED if self._owns_connection and _connect.on_a_private_instance() else STAGED
        self._transfers = TransferCounts()
        self._cancels = CancelTracker(lambda: self.is_shut_down)
        self._actors = RayActors(self, self.namespace, _registry, _checked_functions, self._owns_connection)
        self._groups = RayGroups(self, self._actors, self._cancels, self.device_mode)
        # Events (fray_ray._events): the workers' come through the GCS KV, under this Ray job's namespace
        self._events_ns = _events.namespace(ray.get_runtime_context().get_job_id())
        self._last_result_at = 0.0  # time.monotonic() when a get or wait last returned (see _pull_events)
        self._events_lock = threading.Lock()  # one pull at a time (each chunk is read once)
        if self._owns_connection and not (_recording and _recording.on):  # (its own choice, not the process's)
            _events.disable_workers(self._events_ns)

    def __repr__(self) -> str:
        return f"RayJobContext(namespace={self.namespace!r})"

    # ------------------------------------------------------------------ resources
    def node_resources(self) -> list[dict[str, float]]:
        # Asked afresh each time: the core keeps its answers that a request fits for a few seconds
        # (fray.runtime.arguments.FEASIBLE_SECONDS), so this runs at a new request's first submission, not at each one.
        self._refuse_if_shut_down()
        return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ tasks
    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRef:
        target, args = registered_callable(fn, args)
        remote = _registry.lookup(target)
        if remote is None:
            check_function(fn, _checked_functions)
            remote = _registry.remote_function(target)
        if not is_default_task(request):
            max_calls = worker_calls(request)
            if max_calls is not None:  # Ray takes max_calls only at registration
                remote = _registry.remote_function(target, max_calls)
            remote = remote.options(**task_options(request))
        ray_args, ray_kwargs = unwrap_args(args, self.device_mode), unwrap_kwargs(kwargs, self.device_mode)
        try:
            ref = remote.remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if is_serialization_error(exc):
                name = getattr(fn, "__qualname__", repr(fn))
                raise find_unserializable_argument(name, args, kwargs, exc) from None
            raise
        if ray_args is not args or ray_kwargs is not kwargs:
            hold_shares(ref, ray_args, ray_kwargs)
        submitted(Kind.TASK_SUBMIT, ref, request.options.name or task_name(fn))
        result = ObjectRef(ref, BACKEND)
        if ray_args is not args or ray_kwargs is not kwargs:
            self._cancels.note_dependencies(result, args, kwargs)
        return result

    # ------------------------------------------------------------------ actors (fray_ray._actors)
    def _create_actor(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: ActorRequest,
        member: Member | None = None,
    ) -> ActorHandle:
        created = self._actors.create(klass, args, kwargs, request, member)
        if request.options.max_restarts != 0 and (member is None or not member.distributed):
            self._groups.resend.actors.add(created.payload._actor_id.binary())  # (Ray restarts it: _resend)
        return created

    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        resend = self._groups.resend
        actor, refused = self._groups.gangs.route(handle.payload)  # an SPMD group restarted, restarting or dead
        ray_args, ray_kwargs = unwrap_args(args, self.device_mode), unwrap_kwargs(kwargs, self.device_mode)
        if refused is not None:
            waiting = ObjectRef(refused, BACKEND)
            resend.note(waiting, handle.payload, method, ray_args, ray_kwargs)  # (sent once its group is back)
            return waiting
        restartable = bool(resend.actors) and actor._actor_id.binary() in resend.actors
        after_death = restartable and resend.made_after_death(actor)  # (looked at before the call is made)
        try:
            ref = getattr(actor, method).remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if is_serialization_error(exc):
                raise find_unserializable_argument(f"{handle.class_name}.{method}", args, kwargs, exc) from None
            raise
        if ray_args is not args or ray_kwargs is not kwargs:
            hold_shares(ref, ray_args, ray_kwargs)
        submitted(Kind.CALL_SUBMIT, ref, f"{handle.class_name}.{method}")
        result = ObjectRef(ref, BACKEND)
        if self._groups.gangs.is_member(handle.payload):  # an SPMD member: its call may outlive a death unsent
            resend.note(result, handle.payload, method, ray_args, ray_kwargs)
        elif restartable:  # a restartable actor: fray_ray._resend
            resend.note(result, actor, method, ray_args, ray_kwargs, after_death)
        if ray_args is not args or ray_kwargs is not kwargs:
            self._cancels.note_dependencies(result, args, kwargs)
        return result

    def _get_actor(self, name: str) -> ActorHandle:
        return self._actors.get(name)

    def _kill(self, handle: ActorHandle) -> None:
        self._groups.gangs.killed([handle.payload])  # a member of an SPMD group: the group goes with it
        self._actors.kill([handle])

    # ------------------------------------------------------------------ groups (fray_ray._groups)
    def _create_actor_group(
        self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], group: GroupRequest
    ) -> ActorGroup:
        return self._groups.create(klass, args, kwargs, group)

    def _call_group(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]:
        return self._groups.call(group, method, args, kwargs)

    def _kill_group(self, group: ActorGroup) -> None:
        self._groups.kill(group)

    # ------------------------------------------------------------------ streaming
    def _create_stream_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRefStream:
        """A Ray generator task. Never retried (max_retries=0): a retry would run the generator's side effects
        again after items were delivered; Ray cannot retry only before the first item."""
        target, args = registered_callable(fn, args)
        remote = _stream_registry.lookup(target)
        if remote is None:
            check_function(fn, _checked_functions)
            remote = _stream_registry.stream_function(target)
        max_calls = worker_calls(request)
        if max_calls is not None:
            remote = _stream_registry.stream_function(target, max_calls)
        ray_options = task_options(request)
        ray_options["max_retries"] = 0
        ray_options["retry_exceptions"] = False
        ray_args, ray_kwargs = unwrap_args(args), unwrap_kwargs(kwargs)
        try:
            generator = remote.options(**ray_options).remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if is_serialization_error(exc):
                name = getattr(fn, "__qualname__", repr(fn))
                raise find_unserializable_argument(name, args, kwargs, exc) from None
            raise
        submitted(Kind.TASK_SUBMIT, generator_ref(generator), request.options.name or task_name(fn))
        return ObjectRefStream(
            RayStreamSource(generator, self._cancels.pending_args(args, kwargs), self._cancels), BACKEND
        )

    def _call_actor_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        ray_args, ray_kwargs = unwrap_args(args), unwrap_kwargs(kwargs)
        try:
            remote_method = getattr(handle.payload, method).options(num_returns="streaming")
            generator = remote_method.remote(*ray_args, **ray_kwargs)
        except TypeError as exc:
            if is_serialization_error(exc):
                raise find_unserializable_argument(f"{handle.class_name}.{method}", args, kwargs, exc) from None
            raise
        submitted(Kind.CALL_SUBMIT, generator_ref(generator), f"{handle.class_name}.{method}")
        return ObjectRefStream(
            RayStreamSource(generator, self._cancels.pending_args(args, kwargs), self._cancels), BACKEND
        )

    # ------------------------------------------------------------------ futures
    def _future(self, ref: ObjectRef) -> Future[Any]:
        """From Ray's own ObjectRef.future() (a callback, no thread per ref), with the value as get gives it and
        the exceptions get raises."""
        self._refuse_if_shut_down()  # (fray.runtime.completion and progress bars poll this outside the public checks)
        payload = ref.payload
        out: Future[Any] = Future()
        if self._cancels.cancelled and payload.binary() in self._cancels.cancelled:
            out.set_exception(TaskCancelledError(f"task {payload.hex()} was cancelled"))
            return out
        try:
            inner = payload.future()
        except AttributeError:  # not a plain Ray ObjectRef: the core's default (its context's watcher)
            return super()._future(ref)

        def settle(done: Future[Any]) -> None:
            try:
                value = done.result()
                raise_refusals([value])
            except BaseException as exc:
                if self._groups.gangs.involves(payload):  # may wait for the group's death: not on Ray's thread
                    threading.Thread(
                        target=settle_group_failure, args=(exc,), name="fray-ray-group-failure", daemon=True
                    ).start()
                else:
                    out.set_exception(translate(exc))
                return
            out.set_result(value)

        def settle_group_failure(exc: BaseException) -> None:
            out.set_exception(self._groups.gangs.failure(exc, [payload]) or translate(exc))

        inner.add_done_callback(settle)
        return out

    # ------------------------------------------------------------------ objects
    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        self._refuse_if_shut_down()  # (fray.runtime.completion and progress bars poll this outside the public checks)
        resend = self._groups.resend
        payloads = resend.current(refs) if resend.active else [r.payload for r in refs]
        if self._cancels.cancelled:
            self._cancels.raise_if_cancelled(payloads)
        take_unpacked_bytes()  # start counting from zero (a failed get may have left some)
        start = time.perf_counter()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                values: list[Any] = ray.get(payloads, timeout=timeout)
            except Exception as exc:
                if resend.active and resend.resend_failed(refs, exc):  # calls a restarting actor never received
                    payloads, timeout = resend.current(refs), remaining(deadline)
                    continue
                group_death = self._groups.gangs.failure(exc, payloads)  # a member's SPMD group died: its error
                if group_death is not None:
                    restarting = isinstance(group_death, ActorUnavailableError)
                    if restarting and resend.active and resend.resend_made_after_death(refs, deadline):
                        payloads, timeout = resend.current(refs), remaining(deadline)
                        continue
                    raise group_death from None
                self._actors.deaths.failed(exc, payloads)  # deaths, and the work that died (_driver_events)
                new = translate(exc)
                if new is exc:
                    raise
                raise new from None
            if not self._groups.gangs.refusing:
                break
            # (calls to an SPMD group restarting or dead: fray_ray._gangs.route) those made while it restarts are
            # sent once it is back; the others raise its error
            if resend.active and resend.resend_waiting(refs, values, deadline):
                payloads, timeout = resend.current(refs), remaining(deadline)
                continue
            raise_refusals(values)
            break
        seconds = time.perf_counter() - start
        nbytes = take_unpacked_bytes() + sum(known_nbytes(v) for v in values)
        self._transfers.count_get(len(values), nbytes, seconds, record=self._owns_connection)
        self._last_result_at = time.monotonic()
        return values

    def _transfer_stats(self) -> dict[str, PathStats]:
        """This process's gets, all by Ray's object store: count of values, bytes where known without a walk
        (out-of-band buffers of packed values, numpy arrays, bytes; 0 for other values) and seconds in
        ray.get; and the workers' loads of device values, counted from their events (none where recording is
        off). Task and actor arguments resolved inside workers are not counted (Ray resolves them)."""
        self._event_store.refresh()  # (what the workers recorded so far, the device loads with it)
        return self._transfers.stats()

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        self._refuse_if_shut_down()  # (fray.runtime.completion and progress bars poll this outside the public checks)
        try:
            return self._wait_for(refs, num_returns, timeout)
        finally:
            self._last_result_at = time.monotonic()

    def _wait_for(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        payloads = [r.payload for r in refs]
        done: set[int] = set()
        cancelled = self._cancels.cancelled
        if cancelled:  # cancelled by fray before Ray could be told: complete (with TaskCancelledError)
            done = {i for i, p in enumerate(payloads) if p.binary() in cancelled}
            if len(done) >= num_returns:
                return done
            num_returns -= len(done)
            payloads = [p for i, p in enumerate(payloads) if i not in done]
        ready, remaining = ray.wait(payloads, num_returns=num_returns, timeout=timeout, fetch_local=False)
        if len(ready) == num_returns and len(remaining) >= _SWEEP_MIN:
            # Ray hands back at most num_returns refs: also the others complete by now (one more wait, no
            # blocking), so that a poller for completions (the core's watcher behind as_completed and progress
            # bars) settles every completed ref in one round, not one per round (quadratic in the refs)
            ready = ready + ray.wait(remaining, num_returns=len(remaining), timeout=0, fetch_local=False)[0]
        if not done and len(ready) == len(payloads):
            return set(range(len(payloads)))
        ready_set = set(ready)
        rest = [i for i in range(len(refs)) if i not in done]
        return done | {i for i, p in zip(rest, payloads, strict=True) if p in ready_set}

    def _put(self, obj: Any) -> ObjectRef:
        try:
            ref = ObjectRef(ray.put(pack(obj)), BACKEND)
        except TypeError as exc:
            if is_serialization_error(exc):
                raise SerializationError(f"cannot serialize the put value of type {type(obj).__name__}") from exc
            raise
        self._cancels.puts.add(ref)  # ready at once: never kept as a pending argument
        return ref

    # ------------------------------------------------------------------ events (fray_ray._events)
    def _pull_events(self) -> list[ProcessEvents]:
        """The workers' events since the last pull, through the GCS KV (fray_ray._events). First waits (0.3 s
        at most) until the workers have flushed what they recorded before the last get or wait returned, so a
        task whose result was got shows its end. A worker's context pulls nothing: the driver reads them all."""
        if not self._owns_connection:
            return []
        _events.settle(self._last_result_at)
        with self._events_lock:
            self._actors.deaths.poll()  # the deaths Ray reports that no failed get showed
            batches = _events.pull(self._events_ns)
        self._transfers.count_device_loads(batches)
        return batches

    def _engine_links(self) -> dict[str, str]:
        url = _connect.dashboard_url()  # (fray's private Ray runs none)
        return {"Ray dashboard": url} if url else {}

    # ------------------------------------------------------------------ cancel (fray_ray._cancel)
    def _cancel(self, ref: ObjectRef) -> None:
        self._cancels.cancel(ref)

    def _shutdown(self) -> None:
        self._actors.forget()
        self._groups.gangs.close()
        self._groups.remove_all()  # the non-detached groups created here (removing one kills its members)
        if self._owns_connection:
            try:
                _events.forget(self._events_ns)  # nothing of this job's events lingers in a cluster
            except Exception:  # Ray going away
                pass
            _connect.release()


_remote.install_worker_context(functools.partial(RayJobContext, _attach_only=True))
