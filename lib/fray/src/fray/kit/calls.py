"""The kit's tasks: their record (state, resources, attempts) and what interrupts one (cancel)."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from fray.kit.ledger import Signature
from fray.kit.objects import Entry
from fray.runtime import worker_output as output
from fray.runtime.lifecycle import TaskState
from fray.types import TaskOptions

__all__ = ["Interrupt", "Task", "async_raise", "mark_dispatched", "this_thread"]

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
        "options",
        "request",
        "state",
        "stolen",
        "thread_id",
    )

    def __init__(
        self, fn: Callable[..., Any], call: Any, has_refs: bool, options: TaskOptions, request: Signature, entry: Entry
    ) -> None:
        self.fn, self.call, self.has_refs = fn, call, has_refs
        self.options, self.request, self.entry = options, request, entry
        self.attempts = 0
        self.name: str = options.name or _name_of(fn)  # how its events name it
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
        return _label(str(self.options.name or getattr(self.fn, "__name__", "task")), _pid[0])


def _name_of(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None)
    return name if type(name) is str else str(fn)


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
