"""Task scheduling, a part of the Controller: a queue of tasks placed on worker processes by free resources,
sent in batches, retried on crashes, cancelled on request.
"""

from __future__ import annotations

import hashlib
import math
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fray.errors import (
    TaskCancelledError,
)
from fray.outcome import first_failure
from fray.remote_errors import RemoteError
from fray.resources import EPS, fits, task_resources
from fray.states import TaskState
from fray.types import TaskOptions
from fray_monarch import _runtime
from fray_monarch.directory import Entry, ObjectDirectory
from fray_monarch.objects import RefPayload
from fray_monarch.protocol import TaskItem, TaskResult, Value, WireValue

MAX_ENV_PROCS = 4  # processes kept for tasks with their own env vars
PREFETCH = 4  # tasks sent to a process beyond its slots, queued there, to hide the round trip


@dataclass
class Task:
    id: str
    fn_key: str
    fn_data: bytes
    args: WireValue
    deps: list[str]
    resources: dict[str, float]
    options: TaskOptions
    keep: list[Any]
    retries_left: int
    proc: Proc | None = None
    dep_values: list[Value] | None = None
    env_key: tuple[tuple[str, str], ...] = ()
    state: TaskState = TaskState.WAITING
    cancelled: bool = False


@dataclass
class Proc:
    key: str
    host: int
    mesh: Any
    worker: Any
    capacity: dict[str, float]
    pid: int = 0  # known once it answered its first ping, for a process on this machine
    claims: dict[str, float] = field(default_factory=dict)
    outstanding: set[str] = field(default_factory=set)
    blocked: int = 0
    actors: set[str] = field(default_factory=set)
    fns_sent: set[str] = field(default_factory=set)
    alive: bool = True
    env_key: tuple[tuple[str, str], ...] = ()  # non-empty: a process that only runs tasks with exactly this env
    dedicated: str = ""  # non-empty: the process of one actor (an SPMD member, a group member): no tasks, no others
    taking_back: bool = False  # an unqueue request is in flight

    @property
    def general(self) -> bool:
        """A worker process for tasks (and actors) with no env of its own."""
        return not self.env_key and not self.dedicated

    @property
    def free_capacity(self) -> dict[str, float]:
        return {k: self.capacity.get(k, 0.0) - self.claims.get(k, 0.0) for k in set(self.capacity) | set(self.claims)}

    @property
    def slots(self) -> int:
        return max(1, math.floor(self.free_capacity.get("CPU", 0.0) + EPS))

    def fits_at_all(self, res: dict[str, float]) -> bool:
        return fits(self.free_capacity, res)


class TaskScheduling:
    """The task half of the Controller (mixed into it; its state is set by Controller.__init__)."""

    lock: threading.RLock
    objects: ObjectDirectory
    tasks: dict[str, Task]
    queue: deque[Task]
    procs: list[Proc]
    fn_cache: dict[int, tuple[Any, str, bytes]]
    closed: bool

    if TYPE_CHECKING:  # provided by the Controller or its other parts

        def new_oid(self) -> str: ...
        def _spawn_proc(self, host: int, env_key: tuple[tuple[str, str], ...] = ()) -> Proc: ...
        def open_stream(self, sid: str) -> Any: ...
        def _stream_task_failed(self, task: Task, error: Any) -> None: ...

    def fn_blob(self, fn: Any) -> tuple[str, bytes]:
        cached = self.fn_cache.get(id(fn))
        if cached is not None and cached[0] is fn:
            return cached[1], cached[2]
        from fray.serialization import dumps

        data = dumps(fn, f"task function {getattr(fn, '__qualname__', fn)}").data
        if len(self.fn_cache) > 4096:
            self.fn_cache.clear()
        key = uuid.uuid4().hex
        self.fn_cache[id(fn)] = (fn, key, data)
        return key, data

    def submit(
        self,
        fn_key: str,
        fn_data: bytes,
        args: WireValue,
        deps: list[str],
        options: TaskOptions,
        keep: list[Any],
        proc_key: str | None = None,
    ) -> RefPayload:
        with self.lock:
            entry, payload = self.objects.new(self.new_oid())
            if proc_key is not None:
                entry.remote[proc_key] = 1
            retries = options.max_retries
            task = Task(entry.id, fn_key, fn_data, args, deps, task_resources(options), options, keep, retries)
            if options.runtime_env is not None and options.runtime_env.env:
                task.env_key = tuple(sorted(options.runtime_env.env.items()))
            self.tasks[task.id] = task
            if options.streaming:
                self.open_stream(task.id).task = task
            dep_entries = [self.objects.get(d) for d in deps]
            if not dep_entries:
                task.state = TaskState.QUEUED
                self.queue.append(task)
                self._pump()
            else:
                self.objects.when(dep_entries, len(dep_entries), lambda: self._deps_ready(task, dep_entries))
            return payload

    def submit_remote(self, proc_key: str, fn_data: bytes, args: WireValue, deps: list[str], options: Any) -> str:

        key = hashlib.sha1(fn_data).hexdigest()
        keep = [RefPayload(i) for i in (*args.contained, *deps)]
        return self.submit(key, fn_data, args, deps, options, keep, proc_key).id

    def _deps_ready(self, task: Task, deps: list[Entry]) -> None:
        with self.lock:
            if task.state != TaskState.WAITING:
                return
            failed = first_failure([dep.outcome for dep in deps])
            if failed is not None:
                self._finish_task(task, None, deps[failed].error)
                return
            task.dep_values = [dep.stored() for dep in deps]
            task.state = TaskState.QUEUED
            self.queue.append(task)
            self._pump()

    def _env_procs(self, task: Task) -> None:
        """Under the lock: a task with env vars runs only in a process started with exactly those vars set (so
        they are real process environment, seen by C code and subprocesses, and leak into no other task)."""
        if not task.env_key or any(p.env_key == task.env_key for p in self.procs):
            return
        env_procs = [p for p in self.procs if p.env_key]
        if len(env_procs) >= MAX_ENV_PROCS:
            idle = [p for p in env_procs if not p.outstanding]
            if idle:
                self._retire(idle[0])
        self._spawn_proc(0, task.env_key)

    def _retire(self, proc: Proc) -> None:
        proc.alive = False
        self.procs.remove(proc)
        _runtime.on_done(proc.mesh.stop(), lambda _v, _e: None)

    def _pick_proc(self, task: Task) -> Proc | None:
        best, best_load = None, None
        for proc in self.procs:
            if not proc.alive or proc.dedicated or proc.env_key != task.env_key or not proc.fits_at_all(task.resources):
                continue
            load = len(proc.outstanding) - proc.blocked
            if load >= proc.slots + PREFETCH:
                continue
            if best_load is None or load < best_load:
                best, best_load = proc, load
        return best

    def _pump(self) -> None:
        """Under the lock: send queued tasks to processes with room, in batches."""
        if self.closed:
            return
        batches: dict[str, tuple[Proc, list[Any]]] = {}
        skipped: list[Task] = []
        while self.queue:
            task = self.queue[0]
            self._env_procs(task)
            proc = self._pick_proc(task)
            if proc is None:
                fits = any(
                    not p.dedicated and p.env_key == task.env_key and p.fits_at_all(task.resources) for p in self.procs
                )
                if fits or len(skipped) > 64:
                    break  # everything is busy: wait for a completion
                skipped.append(self.queue.popleft())  # fits nowhere right now (actors hold it): let others by
                continue
            self.queue.popleft()
            task.proc, task.state = proc, TaskState.DISPATCHED
            proc.outstanding.add(task.id)
            fn_data = None if task.fn_key in proc.fns_sent else task.fn_data
            proc.fns_sent.add(task.fn_key)
            item = TaskItem(
                task.id,
                task.fn_key,
                fn_data,
                task.args,
                tuple(task.dep_values or ()),
                task.resources,
                task.options.streaming,
                task.options.name,
            )
            batches.setdefault(proc.key, (proc, []))[1].append(item)
        self.queue.extendleft(reversed(skipped))
        for proc, batch in batches.values():
            try:
                proc.worker.run.broadcast(batch)
            except Exception:
                _runtime.log.exception("fray: could not send tasks to %s", proc.key)
        if not self.queue:
            self._take_back()

    def _take_back(self) -> None:
        """Under the lock, with nothing left to send: if a process has a free slot while another has tasks
        queued behind its running ones (sent ahead, PREFETCH), take those back to run them on the free one.
        Without this a short task could wait behind a long one while a CPU idles."""
        for proc in self.procs:
            queued_there = len(proc.outstanding) - proc.blocked - proc.slots
            if queued_there <= 0 or proc.taking_back or not proc.alive or proc.dedicated:
                continue
            room = sum(
                max(0, p.slots - (len(p.outstanding) - p.blocked))
                for p in self.procs
                if p is not proc and p.alive and not p.dedicated and p.env_key == proc.env_key
            )
            if room <= 0:
                continue
            proc.taking_back = True
            try:
                fut = proc.worker.unqueue.call_one(min(room, queued_there))
            except Exception:
                proc.taking_back = False
                continue
            _runtime.on_done(fut, lambda tids, exc, p=proc: self._taken_back(p, tids, exc))

    def _taken_back(self, proc: Proc, tids: list[str] | None, exc: BaseException | None) -> None:
        with self.lock:
            proc.taking_back = False
            if exc is not None or not tids:
                return
            for tid in tids:  # the last sent first: appendleft keeps their order
                task = self.tasks.get(tid)
                if task is None or task.proc is not proc or task.state != TaskState.DISPATCHED:
                    continue
                proc.outstanding.discard(tid)
                task.proc, task.state = None, TaskState.QUEUED
                self.queue.appendleft(task)
            self._pump()

    def _task_result(self, proc_key: str, result: TaskResult) -> None:
        tid = result.id
        task = self.tasks.get(tid)
        if task is None or task.proc is None or task.proc.key != proc_key:
            return  # a late report from a process we already gave up on
        task.proc.outstanding.discard(tid)
        if result.status == "ok" and result.value is not None:
            self._finish_task(task, result.value.value, None, result.value.contained)
        elif result.status == "cancelled":
            self._finish_task(task, None, TaskCancelledError(f"task {tid} was cancelled"))
        else:
            payload = result.error
            if task.retries_left != 0 and isinstance(payload, RemoteError) and not task.cancelled:
                exc = payload.rebuild()
                if task.options.should_retry(exc):
                    task.retries_left -= 1
                    task.proc, task.state = None, TaskState.QUEUED
                    self.queue.append(task)
                    return
            self._finish_task(task, None, payload)

    def _finish_task(self, task: Task, value: Value | None, error: Any, contained: tuple[str, ...] = ()) -> None:
        task.state = TaskState.DONE
        if task.proc is not None:
            task.proc.outstanding.discard(task.id)
        self.tasks.pop(task.id, None)
        if task.options.streaming:
            if error is not None:  # it ended without reporting its end: the stream ends with the error
                self._stream_task_failed(task, error)
            return
        entry = self.objects.entries.get(task.id)
        if entry is not None:
            self.objects.complete(entry, value, error, contained)

    def cancel(self, oid: str) -> None:
        with self.lock:
            task = self.tasks.get(oid)
            if task is None:
                return  # finished, an actor call, or a put: nothing to cancel
            if task.state in (TaskState.WAITING, TaskState.QUEUED):
                if task in self.queue:
                    self.queue.remove(task)
                self._finish_task(task, None, TaskCancelledError(f"task {oid} was cancelled before it ran"))
            elif task.state == TaskState.DISPATCHED and task.proc is not None:
                task.cancelled = True
                worker = task.proc.worker
            else:
                return
        try:  # not under the lock: the worker's answer must not wait for it
            worker.cancel.call_one(oid).get(timeout=30)
        except Exception:
            pass
