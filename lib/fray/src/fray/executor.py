"""`ctx.executor()`: a `concurrent.futures.Executor` whose work runs as fray tasks, on any backend.

`submit` returns a real `concurrent.futures.Future` (so `wait`, `as_completed`, callbacks, `asyncio.wrap_future`,
joblib and Dask's local scheduler all take it). The executor keeps at most `max_workers` tasks on the backend and
queues the rest itself, as a ThreadPoolExecutor queues work for its threads: a queued future is PENDING and
`cancel()` takes it out for sure, a future whose task the backend holds is RUNNING and cannot be cancelled (the
standard library's contract; `ctx.cancel` of a running task is a separate, stronger act).
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeoutError
from dataclasses import dataclass
from typing import Any, Protocol, cast

from fray.errors import GetTimeoutError
from fray.executor_map import MapItem, MapRun, MapsInFlight, read_map, run_chunk
from fray.runtime.completion import WatchedContext, outcomes
from fray.runtime.refs import ObjectRef
from fray.runtime.resources import task_resources
from fray.types import TaskOptions

__all__ = [
    "FrayExecutor",
    "TaskFuture",
    "TaskSubmitter",
    "call",
    "cluster_slots",
    "default_workers",
    "task_call",
]

# The default number of tasks an executor keeps on the backend: twice what the cluster runs at once, and at least
# MIN_WORKERS (a ThreadPoolExecutor's largest default). A freed slot waits a driver round trip for its next task;
# with a backend of slow round trips (Ray) too few in flight leave it idle (docs/executors.md, "Cost").
TASKS_PER_SLOT = 2
MIN_WORKERS = 32
# How long the feeder thread (see FrayExecutor._settled_elsewhere) waits for the next settle before it ends.
FEEDER_IDLE_SECONDS = 1.0


class TaskSubmitter(Protocol):
    """What the executor needs of a job context (fray.context.JobContext, which this module does not import: the
    context is built on it)."""

    def create_task(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: TaskOptions | None = None,
    ) -> ObjectRef: ...

    def node_resources(self) -> list[dict[str, float]]: ...

    @property
    def outcome_callbacks_may_submit(self) -> bool: ...

    def _future_of(self, ref: ObjectRef) -> Future[Any]: ...

    def get(self, refs: ObjectRef | list[ObjectRef], timeout: float | None = None) -> Any: ...


def cluster_slots(ctx: TaskSubmitter, options: TaskOptions) -> int:
    """How many tasks with these options the cluster's CPUs run together (at least 1)."""
    cpus = sum(float(node.get("CPU", 0.0)) for node in ctx.node_resources())
    need = task_resources(options).get("CPU", 1.0)
    return max(1, int(cpus // need) if need > 0 else int(cpus))


def default_workers(ctx: TaskSubmitter, options: TaskOptions) -> int:
    """An executor's max_workers when none is given (see TASKS_PER_SLOT)."""
    return max(MIN_WORKERS, TASKS_PER_SLOT * cluster_slots(ctx, options))


@dataclass
class _Work:
    future: TaskFuture
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _map_items(fn: Callable[..., Any], items: Iterator[tuple[Any, ...]], chunksize: int) -> Iterator[MapItem]:
    run = MapRun()  # (what a consumer waiting for a queued item waits on)
    if chunksize == 1:
        for args in items:
            if not callable(fn):
                raise TypeError(f"submit needs a callable, got {type(fn).__name__}")
            yield MapItem(run, *task_call(fn, args))
        return
    for chunk in iter(lambda: list(itertools.islice(items, chunksize)), []):
        yield MapItem(run, run_chunk, (fn, chunk))


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) inside a task whose function is this one (see task_call)."""
    return fn(*args, **kwargs)


def task_call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The function and arguments of a task that calls fn(*args). An executor takes any callable; a plain Python
    function is the task's function itself, anything else travels as the first argument of `call`: a class
    (create_task keeps classes for actors), a builtin (Ray cannot register one without a signature: time.sleep),
    a bound method or a callable object (a backend's per-function registry would keep it, and its object, alive)."""
    return (fn, args) if isinstance(fn, types.FunctionType) else (call, (fn, *args))


class TaskFuture(Future[Any]):
    """The Future `submit` returns (a concurrent.futures.Future). Its `result()` with no timeout, called while the
    task is on the backend, waits through the context's `get`: in_memory then runs a task that has not started
    yet on the waiting thread, saving two thread switches a round trip."""

    _task: tuple[Any, ObjectRef] | None = None  # (context, ref) while the task is on the backend

    def result(self, timeout: float | None = None) -> Any:
        task = self._task
        if timeout is None and task is not None and not self.done():
            self._task = None
            try:
                task[0].get(task[1])
            except Exception:  # the same outcome reaches this future through the executor's callback
                pass
        return super().result(timeout)


class FrayExecutor(Executor):
    """A concurrent.futures.Executor over a fray job context: each submit is one task with these options."""

    def __init__(self, ctx: TaskSubmitter, options: TaskOptions, max_workers: int | None = None) -> None:
        if max_workers is not None:
            if isinstance(max_workers, bool) or not isinstance(max_workers, int):
                raise TypeError(f"max_workers must be an int or None, got {max_workers!r}")
            if max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
        self._ctx = ctx
        self._options = options
        # `_max_workers` is the attribute name Dask's local scheduler reads to size its own queue.
        self._max_workers = max_workers if max_workers is not None else default_workers(ctx, options)
        # A map on an executor made without max_workers sends every item to the backend at once, as a thread
        # pool queues every item at once: the backend runs what its resources allow, and a map's items have no
        # future to cancel one by one (kept to a slot each, the next item waited for a slot to free). Those
        # items hold no slot: they are listed in `_maps` until read, and followed (`_unread`) only where a map
        # ends without reading them all, or at shutdown.
        self._map_limit = max_workers
        self._maps = MapsInFlight()
        self._unread = 0  # the refs being followed for `_maps` (their settles count down)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: deque[_Work | MapItem] = deque()
        self._on_backend = 0
        self._shut_down = False
        self._draining = threading.local()
        self._feed: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._feeding = False

    def __repr__(self) -> str:
        return f"FrayExecutor(max_workers={self._max_workers}, options={self._options!r})"

    # ----------------------------------------------------------------- the Executor API
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run fn(*args, **kwargs) as a task; a Future of its value (its exception, raised with the original type)."""
        if not callable(fn):
            raise TypeError(f"submit needs a callable, got {type(fn).__name__}")
        work = _Work(TaskFuture(), *task_call(fn, args), kwargs)
        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._on_backend >= self._max_workers:
                self._queue.append(work)
                return work.future
            self._on_backend += 1
        self._start(work)
        return work.future

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
    ) -> Iterator[Any]:
        """fn over the items of iterables, results in order. Submits every item now (buffersize=N: only N ahead
        of the caller, as Python 3.14's map), so an error is raised when its item is reached, and TimeoutError
        once `timeout` seconds from this call pass. chunksize > 1 runs that many items per task."""
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None and (
            isinstance(buffersize, bool) or not isinstance(buffersize, int) or buffersize < 1
        ):
            raise ValueError("buffersize must be None or > 0.")
        end = None if timeout is None else timeout + time.monotonic()
        self._follow_unread(self._maps.left())
        items: Iterator[tuple[Any, ...]] = zip(*iterables, strict=False)  # the shortest iterable ends it, as in map()
        submitted = (self._enqueue(work) for work in _map_items(fn, items, chunksize))
        queued = deque(submitted if buffersize is None else itertools.islice(submitted, buffersize))
        reading: list[ObjectRef] = []
        key = self._maps.open(queued, reading) if self._map_limit is None else None
        more = submitted if buffersize is not None else None
        closed = None if key is None else functools.partial(self._maps.close, key)
        results = read_map(self._get, queued, reading, more, end, chunksize > 1, closed)
        if key is not None:  # (a map dropped before its first item is read never runs its generator's finally)
            weakref.finalize(results, self._maps.close, key)
        return results

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No submit after this. cancel_futures: cancel the futures still queued here (not yet on the backend).
        wait: return once every future submitted has settled."""
        with self._lock:
            self._shut_down = True
            cancelled = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
        self._follow_unread([*self._maps.left(), *self._maps.unread()])
        for work in cancelled:
            if isinstance(work, MapItem):
                work.cancelled = True
                work.run.wake()
            else:
                work.future.cancel()
        if wait:
            with self._idle:
                self._idle.wait_for(lambda: self._on_backend == 0 and not self._queue and self._unread == 0)

    # ----------------------------------------------------------------- running work
    def _enqueue(self, work: MapItem) -> MapItem:
        """A map item goes the way a submit does (a slot, else the queue), without a Future of its own (on an
        executor made without max_workers, straight to the backend)."""
        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._map_limit is None:
                slotted = False
            elif self._on_backend >= self._map_limit:
                self._queue.append(work)
                return work
            else:
                slotted = True
                self._on_backend += 1
        if slotted:
            self._start_item(work)
        else:  # (its consumer reads it with `get`, and `_maps` lists it until then)
            try:
                work.ref = self._ctx.create_task(work.fn, work.args, None, self._options)
            except BaseException as exc:  # refused: raised where the caller reaches this item
                work.error = exc
        return work

    def _get(self, ref: ObjectRef | list[ObjectRef], end: float | None) -> Any:
        if end is None:
            return self._ctx.get(ref)
        try:
            return self._ctx.get(ref, timeout=max(0.0, end - time.monotonic()))
        except GetTimeoutError:
            if issubclass(GetTimeoutError, FuturesTimeoutError):  # Python 3.11+: one TimeoutError
                raise
            raise FuturesTimeoutError() from None

    def _start_item(self, work: MapItem) -> None:
        """Send a map item to the backend (it holds a slot already), unless its map was closed meanwhile."""
        if work.cancelled:
            self._slot_freed()
            work.run.wake()
            return
        try:
            ref = self._ctx.create_task(work.fn, work.args, None, self._options)
            # No Future and no value loaded where the backend has outcomes of its own (the consumer's get loads
            # it): their callbacks free the slot, or, where they run under the backend's locks, hand it to
            # the executor's feeder thread; else the context's own future (see _start).
            # The callback holds the ref until it settles: a backend may forget the task of a ref no one holds
            # (monarch), and a map whose caller dropped it still frees its slots.
            ctx = cast(WatchedContext, self._ctx)
            native = ctx._outcomes([ref])
            if native is not None and self._ctx.outcome_callbacks_may_submit:
                native[0].add_callback(functools.partial(self._item_settled, ref))
            elif native is not None:
                native[0].add_callback(functools.partial(self._settled_elsewhere, ref))
            else:
                self._ctx._future_of(ref).add_done_callback(functools.partial(self._item_settled, ref))
        except BaseException as exc:  # refused: raised where the caller reaches this item
            work.error = exc
            self._slot_freed()
            work.run.wake()
            return
        work.ref = ref
        work.run.wake()

    def _item_settled(self, ref: ObjectRef, settled: object) -> None:
        self._slot_freed()

    def _follow_unread(self, refs: list[ObjectRef]) -> None:
        """Follow the tasks of map items without a slot that no consumer will read (or has not read yet, at
        shutdown) until they settle. The callback holds each ref until then: a backend may forget the task of a
        ref no one holds (monarch)."""
        if not refs:
            return
        with self._lock:
            self._unread += len(refs)
        ctx = cast(WatchedContext, self._ctx)
        for ref in refs:
            settled = functools.partial(self._unread_settled, ref)
            try:
                native = ctx._outcomes([ref])  # (the callback takes only this executor's lock: fine under the
                if native is not None:  # backend's own)
                    native[0].add_callback(settled)
                else:
                    self._ctx._future_of(ref).add_done_callback(settled)
            except Exception:  # (the context is shut down: nothing of it runs any more)
                settled(None)

    def _unread_settled(self, ref: ObjectRef, settled: object) -> None:
        with self._lock:
            self._unread -= 1
            if self._unread == 0:
                self._idle.notify_all()

    def _settled_elsewhere(self, ref: ObjectRef, settled: object) -> None:
        """A settle reported under the backend's lock: the feeder thread starts the next work."""
        self._feed.put(None)
        with self._lock:
            if self._feeding:
                return
            self._feeding = True
        threading.Thread(target=self._feed_loop, name="fray-executor-feeder", daemon=True).start()

    def _feed_loop(self) -> None:
        while True:
            try:
                self._feed.get(timeout=FEEDER_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._feed.empty():  # (a settle after this starts a new feeder)
                        self._feeding = False
                        return
                continue
            self._slot_freed()

    def _start(self, work: _Work) -> None:
        """Send work to the backend (it holds a slot already), unless its future was cancelled while queued."""
        if not work.future.set_running_or_notify_cancel():
            self._slot_freed()
            return
        future = work.future
        try:
            ref = self._ctx.create_task(work.fn, work.args, work.kwargs, self._options)
            # Where outcome callbacks may submit (fray.runtime.hooks), the bare outcome: one Future fewer per task. Else
            # the context's own future of ref, settled where the backend chooses (monarch settles outcomes under
            # its controller's lock and loads values on a loop of its own); not ref.future(), which asks the
            # context current in this thread, and that can be the engine's thread that settled the previous task.
            if self._ctx.outcome_callbacks_may_submit:
                outcome, settling = outcomes(cast(WatchedContext, self._ctx), [ref])[0], None
            else:
                outcome, settling = None, self._ctx._future_of(ref)
        except BaseException as exc:  # refused (unserializable argument, shut-down context): the future says it
            future.set_exception(exc)
            self._slot_freed()
            return
        future._task = (self._ctx, ref)
        del work
        if outcome is not None:
            outcome.add_callback(functools.partial(self._settled_outcome, future, ref))
            return
        del ref
        if settling is not None:
            settling.add_done_callback(lambda settled: self._settled(future, settled))

    def _settled_outcome(self, future: TaskFuture, ref: ObjectRef, _settled: object) -> None:
        future._task = None
        try:
            future.set_result(self._ctx.get(ref))
        except BaseException as exc:  # the task's own exception, with its original type
            future.set_exception(exc)
        self._slot_freed()

    def _settled(self, future: TaskFuture, settled: Future[Any]) -> None:
        future._task = None
        try:
            future.set_result(settled.result())
        except BaseException as exc:  # the task's own exception, with its original type
            future.set_exception(exc)
        self._slot_freed()

    def _slot_freed(self) -> None:
        """Start the next queued work in the freed slot. A task that settles at once would start the next from
        inside this call: one loop per thread runs them instead of a recursion as deep as the queue."""
        state = self._draining
        if getattr(state, "active", False):
            state.freed += 1
            return
        state.active, state.freed = True, 1
        try:
            while state.freed:
                state.freed -= 1
                with self._lock:
                    if not self._queue:
                        self._on_backend -= 1
                        if self._on_backend == 0:
                            self._idle.notify_all()
                        continue
                    work = self._queue.popleft()
                if isinstance(work, MapItem):
                    self._start_item(work)
                else:
                    self._start(work)
        finally:
            state.active = False
