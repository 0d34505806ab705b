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
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeoutError
from dataclasses import dataclass
from typing import Any, Protocol, cast

from fray.completion import WatchedContext, outcomes
from fray.errors import GetTimeoutError
from fray.map_item import MapItem, MapRun
from fray.refs import ObjectRef
from fray.remote_errors import RemoteError, capture_exception, rebuild
from fray.resources import task_resources
from fray.types import TaskOptions

__all__ = [
    "ChunkResult",
    "FrayExecutor",
    "TaskFuture",
    "TaskSubmitter",
    "call",
    "cluster_slots",
    "default_workers",
    "run_chunk",
    "task_call",
]

# The default number of tasks an executor keeps on the backend: twice what the cluster runs at once, and at least
# MIN_WORKERS (a ThreadPoolExecutor's largest default). A freed slot waits a driver round trip for its next task;
# with a backend of slow round trips (Ray: ~1 ms) too few in flight leave it idle: 10k tiny tasks on a 2-CPU Ray
# took 1.77x create_task + get with 4, 1.31x with 64 (docs/executors.md, "Cost").
TASKS_PER_SLOT = 2
# A map's values are read with one `get` for as many items as are on the backend when the next is reached, up
# to this many (a get per item cost more than the items' tasks did).
MAP_BATCH = 64
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
    run = MapRun()
    if chunksize == 1:
        for args in items:
            if not callable(fn):
                raise TypeError(f"submit needs a callable, got {type(fn).__name__}")
            yield MapItem(run, *task_call(fn, args))
        return
    for chunk in iter(lambda: list(itertools.islice(items, chunksize)), []):
        yield MapItem(run, run_chunk, (fn, chunk))


@dataclass
class ChunkResult:
    """What a task running a chunk of `map` items returns: the values up to the first failure, and that failure."""

    values: list[Any]
    error: RemoteError | None


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) inside a task whose function is this one (see task_call)."""
    return fn(*args, **kwargs)


def task_call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The function and arguments of a task that calls fn(*args). An executor takes any callable; a plain Python
    function is the task's function itself, anything else travels as the first argument of `call`: a class
    (create_task keeps classes for actors), a builtin (Ray cannot register one without a signature: time.sleep),
    a bound method or a callable object (a backend's per-function registry would keep it, and its object, alive)."""
    return (fn, args) if isinstance(fn, types.FunctionType) else (call, (fn, *args))


def run_chunk(fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> ChunkResult:
    values = []
    for args in chunk:
        try:
            values.append(fn(*args))
        except Exception as exc:  # the items before it are still yielded, then this is raised (as map does)
            return ChunkResult(values, capture_exception(exc))
    return ChunkResult(values, None)


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
        # future to cancel one by one (kept to a slot each, the next item waited for a slot to free).
        self._map_limit = max_workers
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
        items: Iterator[tuple[Any, ...]] = zip(*iterables, strict=False)  # the shortest iterable ends it, as in map()
        submitted = (self._enqueue(work) for work in _map_items(fn, items, chunksize))
        queued = deque(submitted if buffersize is None else itertools.islice(submitted, buffersize))
        return self._map_results(queued, submitted if buffersize is not None else None, end, chunksize > 1)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No submit after this. cancel_futures: cancel the futures still queued here (not yet on the backend).
        wait: return once every future submitted has settled."""
        with self._lock:
            self._shut_down = True
            cancelled = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
        for work in cancelled:
            if isinstance(work, MapItem):
                work.cancelled = True
                work.run.wake()
            else:
                work.future.cancel()
        if wait:
            with self._idle:
                self._idle.wait_for(lambda: self._on_backend == 0 and not self._queue)

    # ----------------------------------------------------------------- running work
    def _enqueue(self, work: MapItem) -> MapItem:
        """A map item goes the way a submit does (a slot, else the queue), without a Future of its own (on an
        executor made without max_workers, straight to the backend)."""
        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if self._map_limit is not None and self._on_backend >= self._map_limit:
                self._queue.append(work)
                return work
            self._on_backend += 1
        self._start_item(work)
        return work

    def _map_results(
        self, queued: deque[MapItem], more: Iterator[MapItem] | None, end: float | None, chunked: bool
    ) -> Iterator[Any]:
        """Each item's value in order, read with the context's `get`; at an error, a timeout or a close, the items
        still queued here are cancelled (as map's futures are)."""
        try:
            while queued:
                if more is not None:
                    queued.extend(itertools.islice(more, 1))
                ref = queued[0].started(end)
                queued.popleft()
                if not chunked:
                    refs = [ref]  # with the items after it already on the backend: one get for them all
                    while more is None and queued and len(refs) < MAP_BATCH and queued[0].ref is not None:
                        refs.append(queued.popleft().started(end))  # (with a buffersize: one by one)
                    del ref
                    yield from self._values(refs, end)
                    continue
                chunk: ChunkResult = self._get(ref, end)
                yield from chunk.values
                if chunk.error is not None:
                    raise rebuild(chunk.error)
        finally:
            for work in queued:
                work.cancelled = True

    def _values(self, refs: list[ObjectRef], end: float | None) -> Iterator[Any]:
        """The values of refs in order. Where one of them failed (or the time ran out), they are read one by one,
        so that the values before it are given and its error is raised when it is reached."""
        if len(refs) > 1:
            try:
                values = deque(self._get(refs, end))
            except Exception:
                values = None
            if values is not None:
                refs.clear()
                while values:  # (each value leaves the batch as it is given: the caller may drop it)
                    yield values.popleft()
                return
        while refs:
            yield self._get(refs.pop(0), end)

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
            # Where outcome callbacks may submit (fray.hooks), the bare outcome: one Future fewer per task. Else
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
