"""The in_memory JobContext: tasks and actors on threads of this process.

It behaves like the distributed backends: arguments, results and put values are serialized by default (so an
unpicklable value or hidden shared state fails here, not on the cluster), resources are accounted, a failed
task raises its original exception type, refs passed as top-level arguments arrive as values.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
import weakref
from functools import partial
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from fray.capabilities import Capability
from fray.context import JobContext, _current, actor_resources, task_resources
from fray.errors import (
    ActorAlreadyExistsError,
    ActorDiedError,
    ActorNotFoundError,
    FrayError,
    GetTimeoutError,
    TaskCancelledError,
    attach_remote_traceback,
)
from fray.futures import wait_for_count
from fray.in_memory._scheduler import Ledger, Signature, Work, signature
from fray.refs import ActorHandle, ObjectRef, public_methods
from fray.serialization import (
    Blob,
    RemoteError,
    capture_exception,
    check_function,
    dumps,
    dumps_call,
    loads,
    note_contained,
)
from fray.types import ActorOptions, Lifetime, TaskOptions

BACKEND = "in_memory"

# One process: refs and actor handles that were pickled are looked up again by id here.
_entries: weakref.WeakValueDictionary[int, _Entry] = weakref.WeakValueDictionary()
_actors: dict[int, _Actor] = {}
_detached: dict[tuple[str, str], _Actor] = {}  # (namespace, name) -> actor; outlives the creating context
_detached_lock = threading.Lock()
_ids = itertools.count(1)
_call_owner: weakref.WeakKeyDictionary[_Entry, _Actor] = weakref.WeakKeyDictionary()
_tls = threading.local()  # .task: the _Task running on this thread (to hand its resources back while blocked)


class _Entry:
    """One object: a Future holding a Blob (serialized value), a raw value, or a failure."""

    __slots__ = ("__weakref__", "future", "id", "task")

    def __init__(self) -> None:
        self.id = next(_ids)
        self.future: Future[Any] = Future()
        self.task: _Task | None = None  # the task that will produce it, until it finishes

    def __reduce__(self) -> tuple[Any, ...]:
        _entries[self.id] = self  # findable by id while any ref to it lives (only pickled entries need this)
        note_contained(self)  # the blob being written keeps this entry alive
        return (_lookup_entry, (self.id,))

    def __repr__(self) -> str:
        return f"#{self.id}"

    def settle(self, value: Any = None, error: BaseException | RemoteError | None = None) -> None:
        try:
            if error is not None:
                self.future.set_exception(_Failure(error))
            else:
                self.future.set_result(value)
        except InvalidStateError:  # already failed (killed actor, cancelled task): the first outcome stands
            pass


def _lookup_entry(entry_id: int) -> _Entry:
    entry = _entries.get(entry_id)
    if entry is None:
        raise FrayError(f"object #{entry_id} is gone: no ref to it was kept")
    return entry


class _Failure(Exception):
    """Carries a task's failure inside a Future; `raise_it` raises the original exception."""

    def __init__(self, error: BaseException | RemoteError) -> None:
        super().__init__()
        self.error = error

    def raise_it(self) -> None:
        if isinstance(self.error, RemoteError):
            raise self.error.rebuild() from None
        raise self.error


class _Interrupt(BaseException):
    """Injected into a running task's thread by cancel()."""


class _Task:
    __slots__ = ("attempts", "call", "entry", "fn", "has_refs", "options", "request", "state", "thread_id")

    def __init__(self, fn: Callable[..., Any], call: Any, has_refs: bool, options: TaskOptions,
                 request: Signature, entry: _Entry) -> None:
        self.fn, self.call, self.has_refs = fn, call, has_refs
        self.options, self.request, self.entry = options, request, entry
        self.attempts = 0
        self.state = "waiting"  # waiting -> queued -> running [-> cancelling] -> finishing -> done | cancelled
        self.thread_id = 0


class _Actor:
    """One actor: its instance lives on a private executor (max_concurrency threads) that runs calls in order."""

    def __init__(self, ctx: InMemoryJobContext, klass: type, options: ActorOptions, namespace: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.id = next(_ids)
        self.ctx = ctx
        self.klass = klass
        self.options = options
        self.namespace = namespace
        self.instance: Any = None
        self.death: BaseException | None = None
        self.pending: set[_Entry] = set()  # calls submitted, not started (cancel can still drop them)
        self.running: set[_Entry] = set()
        self.lock = threading.Lock()
        self.executor = ThreadPoolExecutor(options.max_concurrency, thread_name_prefix=f"fray-actor-{klass.__name__}")
        self.request = signature(actor_resources(options))
        self.holding = False  # True while it holds its resources
        _actors[self.id] = self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_lookup_actor, (self.id,))

    def __repr__(self) -> str:
        return f"{self.klass.__name__}#{self.id}"


def _lookup_actor(actor_id: int) -> _Actor:
    actor = _actors.get(actor_id)
    if actor is None:
        raise ActorDiedError(f"actor #{actor_id} is dead")
    return actor


def _async_raise(thread_id: int, exc_type: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else None
    )


class InMemoryJobContext(JobContext):
    backend = BACKEND
    capabilities = frozenset(
        {
            Capability.DETACHED_ACTORS,  # detached actors outlive their context, within this process
            Capability.TASK_ENV_VARS,  # such tasks run in a child process with that environment
            Capability.CANCEL_RUNNING,  # interrupted at the next Python bytecode, as Ray does
            Capability.ZERO_COPY_OBJECTS,  # get of numpy returns read-only views of the stored copy
        }
    )

    def __init__(self, resources: dict[str, float], serialize: bool = True, namespace: str = "default") -> None:
        self.serialize = serialize
        self.namespace = namespace
        self._ledger = Ledger(resources)
        self._lock = threading.Lock()
        self._names: dict[str, _Actor] = {}
        self._own_actors: dict[int, _Actor] = {}
        self._tasks: dict[int, _Task] = {}  # entry id -> task, while not finished (for shutdown)
        self._requests: dict[int, tuple[TaskOptions, Signature]] = {}  # id(options) -> its resource request
        self._checked_fns: dict[int, Any] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"InMemoryJobContext({self._ledger.totals})"

    def node_resources(self) -> list[dict[str, float]]:
        return [self._ledger.totals]

    # ------------------------------------------------------------------ values
    def _encode(self, value: Any, what: str) -> Any:
        return dumps(value, what) if self.serialize else value

    @staticmethod
    def _decode(stored: Any) -> Any:
        return loads(stored) if isinstance(stored, Blob) else stored

    def _put(self, obj: Any) -> ObjectRef:
        self._check_open()
        entry = _Entry()
        entry.settle(self._encode(obj, "the value passed to put"))
        return ObjectRef(entry, BACKEND)

    # ------------------------------------------------------------------ tasks
    def _create_task(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: TaskOptions
    ) -> ObjectRef:
        if self._closed:
            self._check_open()
        deps = _top_level_entries(args, kwargs)
        if self.serialize:
            check_function(fn, self._checked_fns)
            call: Any = dumps_call(str(options.name or getattr(fn, "__qualname__", fn)), args, kwargs)
        else:
            call = (args, kwargs)
        entry = _Entry()
        request = self._requests.get(id(options))
        if request is None or request[0] is not options:
            request = self._remember_request(options)
        task = _Task(fn, call, bool(deps), options, request[1], entry)
        entry.task = task
        self._tasks[entry.id] = task
        if deps:
            self._when_ready(deps, partial(self._enqueue, task))
        else:
            self._enqueue(task)
        return ObjectRef(entry, BACKEND)

    def _remember_request(self, options: TaskOptions) -> tuple[TaskOptions, Signature]:
        if len(self._requests) > 256:
            self._requests.clear()
        request = self._requests[id(options)] = (options, signature(task_resources(options)))
        return request

    @staticmethod
    def _when_ready(deps: list[_Entry], then: Callable[[], None]) -> None:
        """Call `then` once every dependency is complete (so a waiting task holds no resources)."""
        remaining = [len(deps)]
        lock = threading.Lock()

        def one_done(_: Future[Any]) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                then()

        for dep in deps:
            dep.future.add_done_callback(one_done)

    def _enqueue(self, task: _Task) -> None:
        if task.state != "waiting":
            return
        task.state = "queued"
        try:
            self._ledger.submit(task.request, partial(self._run_task, task))
        except RuntimeError:
            self._finish_task(task, error=TaskCancelledError("the context was shut down before the task ran"))

    def _run_task(self, task: _Task) -> Work | None:
        """Run one task on this worker thread; return the next work its freed resources let start."""
        lock = self._lock
        with lock:
            if task.state != "queued":  # cancelled while queued
                return self._ledger.release(task.request)
            task.state = "running"
            task.thread_id = threading.get_ident()
        _tls.task = task
        token = _current.set(self)
        retry = False
        error: Any = None
        value: Any = None
        try:
            try:
                call = task.call
                args, kwargs = loads(call) if self.serialize else call
                if task.has_refs:
                    args, kwargs = self._resolve_refs(args, kwargs)
                env = task.options.runtime_env
                if env is not None and env.env:
                    from fray.in_memory._subprocess import run_in_child

                    value = run_in_child(task.fn, args, kwargs, dict(env.env))
                else:
                    value = task.fn(*args, **kwargs)
                if self.serialize:
                    value = dumps(value, "the return value")
            finally:
                with lock:
                    interrupted = task.state == "cancelling"
                    task.state = "finishing"
                if interrupted:
                    _async_raise(threading.get_ident(), None)  # drop an interrupt that arrived too late
            if interrupted:
                value, error = None, TaskCancelledError("the task was cancelled while running")
        except _Interrupt:
            error = TaskCancelledError("the task was cancelled while running")
        except _Failure as failure:  # a top-level ref argument failed: the task fails with that error
            error = failure.error
        except BaseException as exc:
            task.attempts += 1
            budget = task.options.max_retries
            retry = task.options.should_retry(exc) and (budget < 0 or task.attempts <= budget)
            error = self._remote_error(exc)
        finally:
            _current.reset(token)
            _tls.task = None
            next_work = self._ledger.release(task.request, finishing=not retry)
        if retry:
            task.state = "waiting"
            self._enqueue(task)
        else:
            self._finish_task(task, value, error)
        return next_work

    def _finish_task(self, task: _Task, value: Any = None, error: Any = None) -> None:
        task.state = "done"
        self._tasks.pop(task.entry.id, None)
        task.entry.task = None
        task.call = None
        task.entry.settle(value, error)

    def _remote_error(self, exc: BaseException) -> BaseException | RemoteError:
        if self.serialize:
            return capture_exception(exc)
        import traceback

        return attach_remote_traceback(exc, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))

    def _resolve_call(self, call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = self._decode(call)
        return self._resolve_refs(args, kwargs)

    def _resolve_refs(self, args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Top-level ObjectRef arguments arrive as their values (refs nested in containers stay refs)."""
        args = tuple(self._value_of(a) if isinstance(a, ObjectRef) else a for a in args)
        kwargs = {k: self._value_of(v) if isinstance(v, ObjectRef) else v for k, v in kwargs.items()}
        return args, kwargs

    def _value_of(self, ref: ObjectRef) -> Any:
        if ref.backend != BACKEND:
            raise ValueError(f"{ref!r} belongs to the {ref.backend!r} backend")
        entry: _Entry = ref.payload
        return self._decode(entry.future.result())  # raises _Failure if that task failed

    def _cancel(self, ref: ObjectRef) -> None:
        entry: _Entry = ref.payload
        with self._lock:
            task = entry.task
            if task is None:
                state = "done"
            else:
                state = task.state
                if state in ("waiting", "queued"):
                    task.state = "cancelled"
                elif state == "running" and task.thread_id is not None:
                    task.state = "cancelling"
                    _async_raise(task.thread_id, _Interrupt)
        if state in ("waiting", "queued"):
            self._finish_task(task, error=TaskCancelledError("the task was cancelled before it ran"))  # type: ignore[arg-type]
            return
        actor = _call_owner.get(entry)
        if state == "done" and actor is not None:  # an actor call: drop it if it has not started
            with actor.lock:
                queued = entry in actor.pending
                actor.pending.discard(entry)
            if queued:
                entry.settle(error=TaskCancelledError("the actor call was cancelled before it ran"))

    # ------------------------------------------------------------------ get / wait
    def _blocking(self) -> Signature | None:
        """If this thread runs a task, hand its resources back while it blocks (returns what to take back)."""
        task: _Task | None = getattr(_tls, "task", None)
        if task is None or not task.request or self._tasks.get(task.entry.id) is not task:
            return None
        self._ledger.give_back(task.request)
        return task.request

    def _get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        futures = [ref.payload.future for ref in refs]
        if not all(f.done() for f in futures):
            held = self._blocking()
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                for future in futures:
                    if not future.done():
                        left = None if deadline is None else max(0.0, deadline - time.monotonic())
                        try:
                            future.exception(left)  # waits on the future's own condition; never raises its error
                        except FutureTimeoutError:
                            pass
                        if not future.done():
                            missing = sum(not f.done() for f in futures)
                            raise GetTimeoutError(
                                f"get timed out after {timeout} s: {missing} of {len(futures)} refs not ready"
                            )
            finally:
                if held:
                    self._ledger.reacquire(held)
        values = []
        decode = self._decode
        for future in futures:
            try:
                values.append(decode(future.result()))
            except _Failure as failure:
                failure.raise_it()
        return values

    def _wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        futures = [ref.payload.future for ref in refs]
        held = None if sum(f.done() for f in futures) >= num_returns or timeout == 0 else self._blocking()
        try:
            return wait_for_count(futures, num_returns, timeout)
        finally:
            if held:
                self._ledger.reacquire(held)

    # ------------------------------------------------------------------ actors
    def _create_actor(
        self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], options: ActorOptions
    ) -> ActorHandle:
        self._check_open()
        if self.serialize:
            check_function(klass, self._checked_fns)
            call: Any = dumps_call(f"{klass.__name__}()", args, kwargs)
        else:
            call = (args, kwargs)
        detached = options.lifetime is Lifetime.DETACHED
        with _detached_lock, self._lock:
            if options.name is not None:
                existing = self._find_named(options.name)
                if existing is not None:
                    if options.get_if_exists:
                        return self._handle(existing)
                    raise ActorAlreadyExistsError(
                        f"an actor named {options.name!r} exists already; pass ActorOptions(get_if_exists=True) "
                        "to reuse it, or pick another name"
                    )
            actor = _Actor(self, klass, options, self.namespace)
            if options.name is not None:
                if detached:
                    _detached[(self.namespace, options.name)] = actor
                else:
                    self._names[options.name] = actor
            if not detached:
                self._own_actors[actor.id] = actor
        # The actor's resources are held from its start until it is killed; its __init__ runs first in its queue,
        # waiting there for those resources, so calls sent meanwhile queue up behind it in order.
        granted = threading.Event()
        if actor.request:
            self._ledger.submit(actor.request, lambda: granted.set())
        else:
            granted.set()
        actor.executor.submit(self._start_actor, actor, call, granted)
        return self._handle(actor)

    def _find_named(self, name: str) -> _Actor | None:
        actor = self._names.get(name) or _detached.get((self.namespace, name))
        return actor if actor is not None and actor.death is None else None

    def _handle(self, actor: _Actor) -> ActorHandle:
        return ActorHandle(actor, BACKEND, actor.klass.__name__, public_methods(actor.klass), actor.options.name)

    def _start_actor(self, actor: _Actor, call: Any, granted: threading.Event) -> None:
        while not granted.wait(0.5):
            if actor.death is not None:
                return
        with actor.lock:
            actor.holding = bool(actor.request)
            if actor.death is not None:  # killed while waiting for resources
                self._release_actor(actor)
                return
        token = _current.set(self)
        try:
            args, kwargs = self._resolve_call(call)
            actor.instance = actor.klass(*args, **kwargs)
        except BaseException as exc:
            error = exc.error.rebuild() if isinstance(exc, _Failure) and isinstance(exc.error, RemoteError) else exc
            actor.death = ActorDiedError(
                f"actor {actor.klass.__name__} died: its __init__ raised {type(error).__name__}: {error}"
            )
            attach_remote_traceback(actor.death, _format(exc))
        finally:
            _current.reset(token)

    def _release_actor(self, actor: _Actor) -> None:
        if actor.holding:
            actor.holding = False
            actor.ctx._ledger.give_back(actor.request)

    def _call_actor(self, handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ObjectRef:
        actor: _Actor = handle.payload
        where = f"{actor.klass.__name__}.{method}"
        call = dumps_call(where, args, kwargs) if self.serialize else (args, kwargs)
        entry = _Entry()
        with actor.lock:
            if actor.death is not None:
                entry.settle(error=_died(actor))
                return ObjectRef(entry, BACKEND)
            actor.pending.add(entry)
            _call_owner[entry] = actor
            try:
                actor.executor.submit(self._run_method, actor, method, call, entry)
            except RuntimeError:  # executor shut down: the actor was killed just now
                actor.pending.discard(entry)
                entry.settle(error=_died(actor))
        return ObjectRef(entry, BACKEND)

    def _run_method(self, actor: _Actor, method: str, call: Any, entry: _Entry) -> None:
        with actor.lock:
            if entry not in actor.pending:  # cancelled or the actor was killed
                return
            actor.pending.discard(entry)
            actor.running.add(entry)
        if actor.death is not None:
            error: Any = _died(actor)
        else:
            token = _current.set(self)
            try:
                args, kwargs = self._resolve_call(call)
                value = self._encode(getattr(actor.instance, method)(*args, **kwargs), f"the return value of {method}")
                error = None
            except _Failure as failure:
                error = failure.error
            except BaseException as exc:
                error = self._remote_error(exc)
            finally:
                _current.reset(token)
        with actor.lock:
            actor.running.discard(entry)
        entry.settle(None if error else value, error)

    def _get_actor(self, name: str) -> ActorHandle:
        with _detached_lock, self._lock:
            actor = self._find_named(name)
        if actor is None:
            raise ActorNotFoundError(f"no live actor named {name!r} in namespace {self.namespace!r}")
        return self._handle(actor)

    def _kill(self, handle: ActorHandle) -> None:
        self._kill_actor(handle.payload, "it was killed")

    def _kill_actor(self, actor: _Actor, why: str) -> None:
        with actor.lock:
            if actor.death is not None and actor.id not in _actors:
                return
            if actor.death is None:
                actor.death = ActorDiedError(f"actor {actor.klass.__name__} is dead: {why}")
            pending = [*actor.pending, *actor.running]
            actor.pending, actor.running = set(), set()
        for entry in pending:
            entry.settle(error=_died(actor))
        actor.executor.shutdown(wait=False, cancel_futures=True)
        _actors.pop(actor.id, None)
        with _detached_lock, self._lock:
            name = actor.options.name
            if name is not None and self._names.get(name) is actor:
                del self._names[name]
            if name is not None and _detached.get((actor.namespace, name)) is actor:
                del _detached[(actor.namespace, name)]
            self._own_actors.pop(actor.id, None)
        with actor.lock:
            self._release_actor(actor)

    # ------------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise FrayError("this in_memory context is shut down; create a new one with fray.init()")

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for actor in list(self._own_actors.values()):
            self._kill_actor(actor, "its context was shut down")
        with self._lock:
            tasks = [t for t in list(self._tasks.values()) if t.state in ("waiting", "queued")]
            for task in tasks:
                task.state = "cancelled"
        for task in tasks:
            self._finish_task(task, error=TaskCancelledError("the context was shut down before the task ran"))
        self._ledger.close()


def _died(actor: _Actor) -> ActorDiedError:
    assert actor.death is not None
    error = ActorDiedError(str(actor.death))
    if hasattr(actor.death, "remote_traceback"):
        attach_remote_traceback(error, actor.death.remote_traceback)
    return error


def _format(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _top_level_entries(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[_Entry]:
    deps = [a.payload for a in args if isinstance(a, ObjectRef) and a.backend == BACKEND]
    deps += [v.payload for v in kwargs.values() if isinstance(v, ObjectRef) and v.backend == BACKEND]
    return deps
