"""`ctx.executor()`: a `concurrent.futures.Executor` whose work runs as fray tasks, on any backend.

`submit` returns a real `concurrent.futures.Future` (so `wait`, `as_completed`, callbacks, `asyncio.wrap_future`,
joblib and Dask's local scheduler all take it). The executor keeps at most `max_workers` tasks on the backend and
queues the rest itself, as a ThreadPoolExecutor queues work for its threads: a queued future is PENDING and
`cancel()` takes it out for sure, a future whose task the backend holds is RUNNING and cannot be cancelled (the
standard library's contract; `ctx.cancel` of a running task is a separate, stronger act).
"""

from __future__ import annotations

import itertools
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Protocol

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
MIN_WORKERS = 32


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

    def _future_of(self, ref: ObjectRef) -> Future[Any]: ...

    def get(self, refs: ObjectRef, timeout: float | None = None) -> Any: ...


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
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: deque[_Work] = deque()
        self._on_backend = 0
        self._shut_down = False
        self._draining = threading.local()

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
        if chunksize == 1:
            submitted = (self.submit(fn, *args) for args in items)
        else:
            chunks = iter(lambda: list(itertools.islice(items, chunksize)), [])
            submitted = (self.submit(run_chunk, fn, chunk) for chunk in chunks)
        futures = deque(submitted if buffersize is None else itertools.islice(submitted, buffersize))
        return self._results(futures, submitted if buffersize is not None else None, end, chunksize > 1)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No submit after this. cancel_futures: cancel the futures still queued here (not yet on the backend).
        wait: return once every future submitted has settled."""
        with self._lock:
            self._shut_down = True
            cancelled = list(self._queue) if cancel_futures else []
            if cancel_futures:
                self._queue.clear()
        for work in cancelled:
            work.future.cancel()
        if wait:
            with self._idle:
                self._idle.wait_for(lambda: self._on_backend == 0 and not self._queue)

    # ----------------------------------------------------------------- running work
    def _results(
        self, futures: deque[Future[Any]], more: Iterator[Future[Any]] | None, end: float | None, chunked: bool
    ) -> Iterator[Any]:
        try:
            while futures:
                if more is not None:
                    futures.extend(itertools.islice(more, 1))
                timeout = None if end is None else end - time.monotonic()
                if not chunked:
                    # no local name holds the value while the caller has it (a result can be large)
                    yield _result_or_cancel(futures.popleft(), timeout)
                    continue
                chunk: ChunkResult = _result_or_cancel(futures.popleft(), timeout)
                yield from chunk.values
                if chunk.error is not None:
                    raise rebuild(chunk.error)
        finally:
            for future in futures:
                future.cancel()

    def _start(self, work: _Work) -> None:
        """Send work to the backend (it holds a slot already), unless its future was cancelled while queued."""
        if not work.future.set_running_or_notify_cancel():
            self._slot_freed()
            return
        future = work.future
        try:
            ref = self._ctx.create_task(work.fn, work.args, work.kwargs, self._options)
            # The context's own future of ref, settled where the backend chooses (monarch loads values on a loop
            # of its own, outside its controller's lock: loading here from its bare outcome's callback cost 2.1x
            # create_task + get against 1.4x); not ref.future(), which asks the context current in this thread,
            # and that can be the engine's thread that settled the previous task.
            settling = self._ctx._future_of(ref)
        except BaseException as exc:  # refused (unserializable argument, shut-down context): the future says it
            future.set_exception(exc)
            self._slot_freed()
            return
        future._task = (self._ctx, ref)
        del work, ref
        settling.add_done_callback(lambda settled: self._settled(future, settled))

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
                self._start(work)
        finally:
            state.active = False


def _result_or_cancel(future: Future[Any], timeout: float | None) -> Any:
    try:
        return future.result(timeout)
    finally:
        future.cancel()
