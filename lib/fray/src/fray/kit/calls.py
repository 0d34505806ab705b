"""The kit's tasks: their record (state, resources, attempts), what an engine is given to run one attempt
(TaskRun), and what interrupts one (cancel)."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from fray.kit.objects import Entry
from fray.runtime import worker_output as output
from fray.runtime.lifecycle import TaskState
from fray.runtime.requests import TaskRequest

__all__ = ["Interrupt", "Task", "TaskRun", "async_raise", "mark_dispatched", "this_thread"]

this_thread = threading.local()  # .task: the Task running on this thread (to hand its resources back while blocked)


class Interrupt(BaseException):
    """Injected into a running task's thread by cancel()."""


class Task:
    __slots__ = (
        "attempts",
        "call",
        "entry",
        "fn",
        "gpus",
        "has_refs",
        "held",
        "lock",
        "name",
        "request",
        "state",
        "stolen",
        "thread_id",
    )

    def __init__(self, fn: Callable[..., Any], call: Any, has_refs: bool, request: TaskRequest, entry: Entry) -> None:
        self.fn, self.call, self.has_refs = fn, call, has_refs
        self.request, self.entry = request, entry
        self.attempts = 0
        self.name = request.name  # how its events name it
        # Guards its state: a lock of its own, not the ledger's, which the workers contend for.
        self.lock = threading.Lock()
        # waiting (for its ref arguments) -> queued (for resources) -> dispatched (resources held, on the workers'
        # queue) -> running [-> cancelling] -> finishing -> done; or -> cancelled before running.
        self.state = TaskState.WAITING
        self.stolen = False  # run by a thread blocked in get on it, rather than by the worker it was queued for
        self.thread_id = 0
        self.gpus: tuple[int, ...] = ()  # the devices it holds while dispatched or running (fray.runtime.gpus)
        self.held: list[Any] | None = None  # what its process was handed by name (fray.kit.remote), kept with it

    @property
    def label(self) -> str:
        """How its printed lines are prefixed: `(name pid=N)`, as Ray does."""
        return _label(str(self.request.options.name or getattr(self.fn, "__name__", "task")), _pid[0])

    def run(self) -> TaskRun:
        """What the engine is given for the attempt about to run."""
        return TaskRun(self.entry.id, self.fn, self.request, self.gpus)


class TaskRun(NamedTuple):
    """One attempt of a task, as an engine is given it (never the kit's own record of the task, whose state the
    kit keeps changing): its id, the function, the request the core computed, and the devices it holds now. A
    NamedTuple: immutable, and made once per attempt at a tuple's cost."""

    id: int
    fn: Callable[..., Any]
    request: TaskRequest
    gpus: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.request.name


@functools.lru_cache(maxsize=256)
def _label(name: str, pid: int) -> str:  # one string per task name, not one formatted (and a getpid) per task
    return output.label_for(name, pid)


_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def mark_dispatched(task: Task, gpus: tuple[int, ...]) -> None:  # under the ledger's lock: resources taken
    task.gpus = gpus
    with task.lock:
        if task.state == TaskState.QUEUED:
            task.state = TaskState.DISPATCHED


def async_raise(thread_id: int, exc_type: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type else None
    )
