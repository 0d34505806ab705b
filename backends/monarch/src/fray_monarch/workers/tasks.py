"""The task runner of a worker process: tasks sent by the controller run here by local free resources, in
order, each on a thread of its own (threads are reused); a task that waits in get or wait lends its resources to
the tasks queued behind it (`lending`), so nested tasks never deadlock."""

from __future__ import annotations

import ctypes
import queue
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from fray.backend import (
    RECORDER,
    Blob,
    JobContext,
    Kind,
    add,
    capture_exception,
    discover,
    dumps,
    ended,
    fits,
    loads,
    subtract,
    using_gpus,
)
from fray.backend import current as fray_current
from fray.backend import worker_output as fray_output
from fray.errors import TaskCancelledError
from fray_monarch.core.calls import fill_deps
from fray_monarch.core.protocol import TaskItem, TaskResult, TaskStatus
from fray_monarch.workers.runtime import WorkerRuntime

__all__ = ["TaskRunner", "lending"]

_here = threading.local()  # .task: (its runner, its id) of the task this thread runs


@contextmanager
def lending() -> Iterator[None]:
    """The task this thread runs (if any) waits meanwhile: its resources are lent to the tasks queued behind it."""
    here: tuple[TaskRunner, str] | None = getattr(_here, "task", None)
    if here is None:
        yield
        return
    runner, tid = here
    runner.lend(tid)
    try:
        yield
    finally:
        runner.take_back(tid)


class TaskRunner:
    """Runs the tasks of one worker process (ctx: the process's job context, current in every task)."""

    def __init__(self, rt: WorkerRuntime, ctx: JobContext, capacity: dict[str, float]) -> None:
        self.rt = rt
        self.ctx = ctx
        self.free = dict(capacity)
        self.capacity = dict(capacity)
        self.queue: deque[TaskItem] = deque()
        self.running: dict[str, dict[str, float]] = {}  # task id -> its resources
        self.threads: dict[str, int] = {}  # task id -> thread ident, while the user function runs
        self.fn_data: dict[str, bytes] = {}
        self.fns: dict[str, Any] = {}
        self.lock = threading.RLock()
        self.ready: queue.SimpleQueue[TaskItem] = queue.SimpleQueue()
        self.idle = 0  # task threads waiting for work (they are never killed, even by a stray async exception)

    def enqueue(self, batch: list[TaskItem]) -> None:
        with self.lock:
            for item in batch:
                if item.fn_data is not None:
                    self.fn_data[item.fn_key] = item.fn_data
                self.queue.append(item)
            self._start_ready()

    def unqueue(self, count: int) -> list[str]:
        """Give back up to `count` tasks queued here and not started, the last sent first (the controller runs
        them on a process with room)."""
        with self.lock:
            return [self.queue.pop().id for _ in range(min(count, len(self.queue)))]

    def set_capacity(self, capacity: dict[str, float]) -> None:
        with self.lock:
            for key in set(capacity) | set(self.capacity):
                self.free[key] = self.free.get(key, 0.0) + capacity.get(key, 0.0) - self.capacity.get(key, 0.0)
            self.capacity = dict(capacity)
            self._start_ready()

    def cancel(self, tid: str) -> str:
        """Drop the task if queued here; interrupt it if it runs (TaskCancelledError raised in its thread)."""
        with self.lock:
            for item in self.queue:
                if item.id == tid:
                    self.queue.remove(item)
                    self.rt.report(TaskResult(tid, TaskStatus.CANCELLED))
                    return "dropped"
            thread = self.threads.get(tid)
            if thread is None:
                return "unknown"
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(TaskCancelledError))
            return "interrupted"

    def _fits(self, res: Mapping[str, float]) -> bool:
        return fits(self.free, res)

    def _start_ready(self) -> None:
        for _ in range(len(self.queue)):
            item = self.queue[0]
            res = item.resources
            if not self._fits(res) and self.running:
                return  # in order: wait for room (a task larger than the whole process still runs alone)
            self.queue.popleft()
            subtract(self.free, res)
            self.running[item.id] = res
            if self.idle > 0:
                self.idle -= 1
            else:
                threading.Thread(target=self._task_thread, name="fray-task", daemon=True).start()
            self.ready.put(item)

    def _task_thread(self) -> None:
        while True:
            try:
                item = self.ready.get()
                self._execute(item)
                with self.lock:
                    self.idle += 1
            except BaseException:  # e.g. a cancel's TaskCancelledError arriving after its task ended
                pass

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {
                "free": dict(self.free),
                "running": list(self.running),
                "queued": len(self.queue),
                "idle": self.idle,
                "threads": threading.active_count(),
            }

    def _done(self, tid: str) -> None:
        with self.lock:
            res = self.running.pop(tid, None)
            if res is not None:
                add(self.free, res)
            self._start_ready()

    def lend(self, tid: str) -> None:
        """The task tid waits in get/wait: its resources are lent to queued tasks."""
        with self.lock:
            add(self.free, self.running.get(tid, {}))
            self._start_ready()

    def take_back(self, tid: str) -> None:
        with self.lock:
            subtract(self.free, self.running.get(tid, {}))  # may go below zero for a moment (oversubscribed)

    def load_fn(self, key: str) -> Any:
        fn = self.fns.get(key)
        if fn is None:
            fn = self.fns[key] = loads(Blob(self.fn_data[key]))
        return fn

    def _execute(self, item: TaskItem) -> None:
        tid = item.id
        _here.task = (self, tid)
        token = fray_current.push(self.ctx)
        label_token = None
        started = ""  # the name of the task once it has started (fray.telemetry.events)
        result: TaskResult | None = None
        try:
            fn = self.load_fn(item.fn_key)
            name = getattr(fn, "__qualname__", "task")
            started = str(item.name or name)
            RECORDER.record(Kind.TASK_START, tid, started)
            label = item.name or getattr(fn, "__name__", None) or name
            label_token = fray_output.push_label(fray_output.label_for(label, host=self.rt.label_host))
            args, kwargs = self.rt.load(item.args.value, f"the arguments of task {name}")
            if item.deps:
                values = [self.rt.load(d, f"ref argument {i} of task {name}") for i, d in enumerate(item.deps)]
                args, kwargs = fill_deps(args, kwargs, values)
            with self.lock:
                self.threads[tid] = threading.get_ident()
            try:
                with using_gpus(item.gpus, discover()):
                    if item.stream:
                        self.rt.produce(tid, lambda: fn(*args, **kwargs), f"streaming task {name}")
                    else:
                        value = fn(*args, **kwargs)
            finally:
                with self.lock:
                    del self.threads[tid]
            if item.stream:
                result = None  # its items and its end were reported as they came
            else:
                blob = dumps(value, f"the return value of {name}", copy=False, device_mode=self.rt.store.device_mode)
                result = TaskResult(tid, TaskStatus.OK, self.rt.encode(blob, tid))
        except BaseException as exc:
            result = TaskResult(tid, TaskStatus.ERR, error=capture_exception(exc))
        finally:
            if started:
                RECORDER.record(Kind.TASK_END, tid, started, None if result is None else ended(result.error))
            if label_token is not None:
                fray_output.pop_label(label_token)
            fray_current.pop(token)
            _here.task = None
        if result is not None:
            self.rt.report(result)
        self._done(tid)
