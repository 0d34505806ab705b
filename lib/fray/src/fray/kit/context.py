"""The kit's JobContext: every hook of a JobContext, for an engine that only runs calls.

It owns what every such backend would write again: the object table (fray.kit.objects), resources and lending
(fray.kit.ledger), a task's life (waiting for its arguments, queueing, retries, events, cancel: fray.kit.calls),
and actors (names, `get_if_exists`, call queues in order, async methods, kill: fray.kit.actors). A backend subclasses
`KitJobContext` and overrides only what its engine does differently:

- `_run_task(run, args, kwargs)`: "start this call there" (a `TaskRun`: the task's id, function, request and
  devices) and wait for its result (default: on this thread);
- `_load(stored, what)`: "load this value" (default: unpickle here, counted as an in-process transfer);
- `_new_instance(actor, call)` and `_run_method(actor, method, call, life)`: where an actor lives (default: here,
  on threads of its own);
- `capabilities`, and `_pull_events` where its work records events in other processes.

Its calls run on the ledger's worker threads, which a blocked task lends back (10-deep nesting cannot deadlock).
An engine whose work runs in other processes serves nested work from them with fray.kit.remote. in_memory is the
kit's first user; examples/process_pool_backend.py its proof.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import Any, ClassVar

from fray.context import JobContext
from fray.errors import TaskCancelledError, WorkerCrashedError, attach_remote_traceback
from fray.kit.actors import Actor, ActorHooks, ActorTable, call_owner, end_stream_with_failure, live_actor
from fray.kit.calls import Interrupt, Task, async_raise, mark_dispatched, this_thread
from fray.kit.engine import EngineHooks
from fray.kit.ledger import Ledger, Signature, Work, lendable
from fray.kit.objects import IMMUTABLE, Entry, Failure, Serialized, immutable_call
from fray.runtime import current
from fray.runtime import worker_output as output
from fray.runtime.borrowing import not_borrowing
from fray.runtime.capabilities import Capability
from fray.runtime.cuda_values import KEPT
from fray.runtime.gpus import DevicePool, HostGpus
from fray.runtime.groups import Member
from fray.runtime.lifecycle import TaskState
from fray.runtime.outcome import Outcome, first_failure, wait_for, wait_for_get, when
from fray.runtime.refs import ActorHandle, ObjectRef, top_level_refs, with_values
from fray.runtime.remote_errors import RemoteError, capture_exception, format_exception
from fray.runtime.requests import ActorRequest, TaskRequest
from fray.runtime.serialization import Blob, check_function, dumps, dumps_call, loads
from fray.runtime.streams import ItemQueue, ObjectRefStream
from fray.telemetry.events import RECORDER, Kind, choose_recording, ended
from fray.telemetry.transfers import PathStats, TransferStats

__all__ = ["KitJobContext"]


class KitJobContext(EngineHooks, JobContext):
    """A JobContext over an engine that only runs calls: subclass it, set `backend` and `capabilities`, override
    `_run_task` (and where needed `_load`, `_new_instance`, `_run_method`); see this module's docstring."""

    records_by_default: ClassVar[bool] = True  # events (fray.telemetry.events.choose_recording), unless `events` says
    outcome_callbacks_may_submit: ClassVar[bool] = True  # (a task's outcome settles after its locks are let go)

    def __init__(
        self,
        resources: dict[str, float],
        serialize: bool = True,
        namespace: str = "default",
        log_to_driver: bool = True,
        gpus: HostGpus | None = None,
        events: bool | None = None,
    ) -> None:
        super().__init__(recording=choose_recording(self.records_by_default, events))
        self.serialize = serialize
        self.log_to_driver = log_to_driver
        self.namespace = namespace
        # The devices behind resources["GPU"] (without a HostGpus: that many, numbered from 0)
        self.gpus = gpus if gpus is not None else HostGpus.numbered(round(resources.get("GPU", 0.0)), "declared")
        self._ledger = Ledger(resources, DevicePool(self.gpus.ids))
        self._checked_fns: dict[int, Any] = {}
        hooks = ActorHooks(self._encode, self._remote_error, self._new_instance, self._run_method)
        self._actors = ActorTable(self, self._ledger, self._checked_fns, hooks)
        self._tasks: dict[int, Task] = {}  # entry id -> task, while not finished (for shutdown)
        self._transfers = TransferStats()
        # A running task is interrupted on the thread that runs it: only where its code runs on that thread
        self._interruptible = Capability.CANCEL_RUNNING in self.capabilities

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._ledger.totals})"

    def node_resources(self) -> list[dict[str, float]]:
        return [self._ledger.totals]

    # ------------------------------------------------------------------ values
    def _encode(self, value: Any, what: str) -> Any:
        if isinstance(value, Serialized):  # a result that arrived serialized, already in this process's memory
            return value.blob if self.serialize else loads(value.blob, what)
        if self.serialize and type(value) not in IMMUTABLE:  # (CUDA tensors: device copies, fray.runtime.cuda_values)
            return dumps(value, what, device_mode=KEPT)
        return value

    def _decode(self, stored: Any, what: str = "a value") -> Any:
        return self._load(stored, what) if isinstance(stored, Blob) else stored

    def _transfer_stats(self) -> dict[str, PathStats]:
        return self._transfers.snapshot()

    def _put(self, obj: Any) -> ObjectRef:
        self._refuse_if_shut_down()
        entry = Entry()
        entry.settle(self._encode(obj, "the value passed to put"))
        return ObjectRef(entry, self.backend)

    # ------------------------------------------------------------------ actors (ActorTable)
    def _create_actor(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: ActorRequest,
        member: Member | None = None,
    ) -> ActorHandle:
        return self._actors.create(klass, args, kwargs, request, member)

    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        return self._actors.call(handle, method, args, kwargs)

    def _call_actor_stream(
        self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ObjectRefStream:
        return self._actors.call_stream(handle, method, args, kwargs)

    def _get_actor(self, name: str) -> ActorHandle:
        return self._actors.get(name)

    def _kill(self, handle: ActorHandle) -> None:
        self._actors.kill(handle.payload, "it was killed")

    # ------------------------------------------------------------------ tasks
    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRef:
        self._refuse_if_shut_down()
        if self.serialize:
            check_function(fn, self._checked_fns)
        return self._submit_task(fn, args, kwargs, request)

    def _create_stream_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRefStream:
        if self.serialize:
            check_function(fn, self._checked_fns)
        queue = ItemQueue()
        where = f"task {request.name}"

        def produce(*args: Any, **kwargs: Any) -> None:
            items = fn(*args, **kwargs)
            self._actors.stream_items(items, queue, where)

        produce.__name__ = getattr(fn, "__name__", "stream")  # its printed lines are labelled with fn's name
        ref = self._submit_task(produce, args, kwargs, request)
        end_stream_with_failure(ref.payload, queue, self.backend)
        return ObjectRefStream(queue, self.backend)

    def _future(self, ref: ObjectRef) -> Future[Any]:
        outcome: Outcome = ref.payload.outcome
        return outcome.to_future(lambda _: self._value_of(ref, raise_original=True))

    def _outcomes(self, refs: list[ObjectRef]) -> list[Outcome]:
        return [ref.payload.outcome for ref in refs]

    def _submit_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], request: TaskRequest
    ) -> ObjectRef:
        deps = _top_level_entries(args, kwargs, self.backend)
        if self.serialize and not immutable_call(args, kwargs):
            call: Any = dumps_call(request.name, args, kwargs, device_mode=KEPT)
        else:
            call = (args, kwargs)
        entry = Entry()
        task = Task(fn, call, bool(deps), request, entry)
        entry.task = task
        self._tasks[entry.id] = task
        RECORDER.record(Kind.TASK_SUBMIT, entry.id, task.name)
        if deps:
            self._when_ready(deps, partial(self._enqueue, task))
        else:
            self._enqueue(task, fresh=True)
        return ObjectRef(entry, self.backend)

    @staticmethod
    def _when_ready(deps: list[Entry], then: Callable[[], None]) -> None:
        """Call `then` once every dependency is complete (so a waiting task holds no resources)."""
        when([dep.outcome for dep in deps], len(deps), then)

    def _enqueue(self, task: Task, fresh: bool = False) -> None:
        """Queue a task for resources. `fresh`: called from create_task, before anyone holds its ref, so nothing
        can race with this state change (later calls, from dependencies or retries, can race with cancel)."""
        if fresh:
            task.state = TaskState.QUEUED
        else:
            with task.lock:
                if task.state != TaskState.WAITING:
                    return
                task.state = TaskState.QUEUED
        try:
            self._ledger.submit(task.request.resources, partial(self._work_on, task), partial(mark_dispatched, task))
        except RuntimeError:
            self._finish_task(task, error=TaskCancelledError("the context was shut down before the task ran"))

    def _work_on(self, task: Task) -> Work | None:
        """A worker runs one task; returns the next work its freed resources let start, for this thread to run."""
        with task.lock:
            state = task.state
            if state == TaskState.DISPATCHED:
                task.state = TaskState.RUNNING
                task.thread_id = threading.get_ident()
        if state != TaskState.DISPATCHED:  # cancelled: give its resources back; stolen: the thread that runs it will
            return None if task.stolen else self._ledger.release(task.request.resources, devices=task.gpus)
        return self._execute(task, on_worker=True)

    def _run_inline(self, task: Task) -> None:
        """Run a dispatched task on this thread, which would otherwise just block in get waiting for it (saves
        two thread switches; the worker that dequeues it later skips it)."""
        with task.lock:
            if task.state != TaskState.DISPATCHED:
                return
            task.state = TaskState.RUNNING
            task.stolen = True
            task.thread_id = threading.get_ident()
        with not_borrowing():  # (its arguments are its own copies, even where this get borrows: fray.runtime.borrowing)
            next_work = self._execute(task, on_worker=False)
        if next_work is not None:
            self._ledger.workers.submit(next_work)

    def _execute(self, task: Task, on_worker: bool) -> Work | None:
        RECORDER.record(Kind.TASK_START, task.entry.id, task.name)
        outer_task = getattr(this_thread, "task", None)
        this_thread.task = task
        token = current.push(self, lent=True)
        said = output.push_label(task.label) if self.log_to_driver else None
        retry = False
        error: Any = None
        value: Any = None
        try:
            try:
                args, kwargs = self._decode(
                    task.call, f"the arguments of task {getattr(task.fn, '__qualname__', task.fn)}"
                )
                if task.has_refs:
                    args, kwargs = with_values(args, kwargs, self._value_of)
                value = self._run_task(task.run(), args, kwargs)
                if isinstance(value, Serialized):  # from another process: it may name what the task was handed
                    value.blob.contained.extend([*(task.held or ()), *getattr(task.call, "contained", ())])
                value = self._encode(value, "the return value")
            finally:
                with task.lock:
                    interrupted = task.state == TaskState.CANCELLING
                    task.state = TaskState.FINISHING
                if interrupted:
                    async_raise(threading.get_ident(), None)  # drop an interrupt that arrived too late
            if interrupted:
                value, error = None, TaskCancelledError("the task was cancelled while running")
        except Interrupt:
            error = TaskCancelledError("the task was cancelled while running")
        except Failure as failure:  # a top-level ref argument failed: the task fails with that error
            error = failure.error
        except BaseException as exc:
            task.attempts += 1
            budget = task.request.options.max_retries
            # (a crashed worker is re-run whatever retry_exceptions says, as Ray does; the task's own errors only
            # when it asks)
            wanted = isinstance(exc, WorkerCrashedError) or task.request.options.should_retry(exc)
            retry = wanted and (budget < 0 or task.attempts <= budget)
            error = self._remote_error(exc)
        finally:
            if said is not None:
                output.pop_label(said)
            current.pop(token)
            this_thread.task = outer_task
            next_work = self._ledger.release(
                task.request.resources, finishing=on_worker and not retry, devices=task.gpus
            )
            task.gpus = ()
        RECORDER.record(Kind.TASK_END, task.entry.id, task.name, None if error is None else ended(error, retry))
        if retry:
            task.state = TaskState.WAITING
            task.stolen = False
            self._enqueue(task)
        else:
            self._finish_task(task, value, error)
        return next_work

    def _finish_task(self, task: Task, value: Any = None, error: Any = None) -> None:
        task.state = TaskState.DONE
        self._tasks.pop(task.entry.id, None)
        task.entry.task = None
        task.call = None
        task.entry.settle(value, error)

    def _remote_error(self, exc: BaseException) -> BaseException | RemoteError:
        if self.serialize:
            return capture_exception(exc)
        return attach_remote_traceback(exc, format_exception(exc))

    def _resolve_call(self, call: Any, what: str = "the call's arguments") -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A stored call's arguments, its top-level refs by their values (raises Failure if one of them failed)."""
        args, kwargs = self._decode(call, what)
        return with_values(args, kwargs, self._value_of)

    def _value_of(self, ref: ObjectRef, raise_original: bool = False) -> Any:
        """The value of a ref (waiting for it); raises Failure if its task failed (the original exception with
        raise_original)."""
        try:
            return self._decode(self._entry_of(ref).result(), f"the value of {ref!r}")
        except Failure as failure:
            if raise_original:
                failure.raise_it()
            raise

    def _entry_of(self, ref: ObjectRef) -> Entry:
        if ref.backend != self.backend:
            raise ValueError(f"{ref!r} belongs to the {ref.backend!r} backend")
        return ref.payload  # type: ignore[no-any-return]

    def _cancel(self, ref: ObjectRef) -> bool | None:
        entry: Entry = ref.payload
        task = entry.task
        with task.lock if task is not None else contextlib.nullcontext():
            if task is None:
                state = TaskState.DONE
            else:
                state = task.state
                if state in (TaskState.WAITING, TaskState.QUEUED, TaskState.DISPATCHED):
                    task.state = TaskState.CANCELLED
                elif state == TaskState.RUNNING and self._interruptible:
                    task.state = TaskState.CANCELLING
                    async_raise(task.thread_id, Interrupt)
                elif state == TaskState.RUNNING:
                    return False  # (the core raises UnsupportedFeatureError naming cancel_running)
        if state in (TaskState.WAITING, TaskState.QUEUED, TaskState.DISPATCHED):
            self._finish_task(task, error=TaskCancelledError("the task was cancelled before it ran"))
            return None
        actor = call_owner.get(entry)
        if state == TaskState.DONE and actor is not None:  # an actor call: drop it if it has not started
            with actor.lock:
                queued = entry in actor.pending
                actor.pending.discard(entry)
            if queued:
                entry.settle(error=TaskCancelledError("the actor call was cancelled before it ran"))
        return None

    # ------------------------------------------------------------------ get / wait
    @contextlib.contextmanager
    def acting_for(self, work_id: int) -> Iterator[Task | Actor | None]:
        """Serve, on this thread, a request of the task or actor `work_id` living in another process
        (fray.kit.remote): a get or wait of a task lends its resources, as the task's own would here. Yields what
        keeps the refs the reply names (`held`): the task until its result is stored, the actor for its life."""
        task, outer = self._tasks.get(work_id), getattr(this_thread, "task", None)
        this_thread.task = task
        try:
            yield task if task is not None else live_actor(work_id)
        finally:
            this_thread.task = outer

    def _blocking(self) -> Signature | None:
        """If this thread runs a task, hand its resources back while it blocks (returns what to take back)."""
        task: Task | None = getattr(this_thread, "task", None)
        if task is None or not task.request.resources or self._tasks.get(task.entry.id) is not task:
            return None
        lent = lendable(task.request.resources)  # (its GPUs stay held)
        self._ledger.give_back(lent)
        return lent

    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        outcomes = [ref.payload.outcome for ref in refs]
        if all(o.done() for o in outcomes):
            failed = first_failure(outcomes)
        else:
            held = self._blocking()
            try:
                if len(outcomes) == 1:  # (then what is left of the same timeout, never a second one)
                    started = time.monotonic()
                    self._wait_one(refs[0], timeout)
                    if timeout is not None:
                        timeout = max(0.0, timeout - (time.monotonic() - started))
                failed = wait_for_get(outcomes, timeout)
            finally:
                if held:
                    self._ledger.reacquire(held)
        if failed is not None:
            Failure(outcomes[failed].error).raise_it()
        values = [o.value for o in outcomes]
        for i, value in enumerate(values):  # (what each is called is built only for a stored blob to load)
            if isinstance(value, Blob):
                values[i] = self._decode(value, f"the value of {refs[i]!r}")
        return values

    def _wait_one(self, ref: ObjectRef, timeout: float | None) -> None:
        """Without a deadline, a task not started yet runs here, on the waiting thread (a lone ref only:
        inlining a list's tasks makes this thread compete with the workers for the GIL and costs more than it
        saves)."""
        outcome = ref.payload.outcome
        task: Task | None = ref.payload.task
        if timeout is None and task is not None and task.state == TaskState.DISPATCHED:
            if self._tasks.get(task.entry.id) is task:
                self._run_inline(task)
            if outcome.done():
                return
        outcome.wait(timeout)

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        outcomes = [ref.payload.outcome for ref in refs]
        held = None if sum(o.done() for o in outcomes) >= num_returns or timeout == 0 else self._blocking()
        try:
            return wait_for(outcomes, num_returns, timeout)
        finally:
            if held:
                self._ledger.reacquire(held)

    # ------------------------------------------------------------------ lifecycle
    def _shutdown(self) -> None:
        for actor in list(self._actors.own.values()):
            self._actors.kill(actor, "its context was shut down")
        tasks = []
        for task in list(self._tasks.values()):
            with task.lock:
                if task.state in (TaskState.WAITING, TaskState.QUEUED, TaskState.DISPATCHED):
                    task.state = TaskState.CANCELLED
                    tasks.append(task)
        for task in tasks:
            self._finish_task(task, error=TaskCancelledError("the context was shut down before the task ran"))
        self._ledger.close()


def _top_level_entries(args: tuple[Any, ...], kwargs: dict[str, Any], backend: str) -> list[Entry]:
    return [ref.payload for ref in top_level_refs(args, kwargs, backend)]
