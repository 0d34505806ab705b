"""The task scheduler of one context: a queue of tasks placed on worker processes by free resources, sent in
batches, retried on exceptions (should_retry) and crashes, cancelled on request.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fray.backend import RemoteError, TaskOptions, TaskRequest, TaskState, first_failure, fits
from fray.errors import FrayError, TaskCancelledError, WorkerCrashedError
from fray_monarch.core import runtime
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import TaskItem, TaskResult, TaskStatus, Value, WireValue
from fray_monarch.driver.directory import Entry, ObjectDirectory, check_owner
from fray_monarch.driver.ids import Ids
from fray_monarch.driver.proc_rec import EnvKey, Proc, local_part
from fray_monarch.driver.processes import ProcessPool
from fray_monarch.driver.streaming import StreamRegistry

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
    env_key: EnvKey = ()
    state: TaskState = TaskState.WAITING
    cancelled: bool = False
    gpus: tuple[int, ...] = ()  # the devices it holds while sent to a process (of that process's host)
    reserved: list[tuple[Proc, dict[str, float]]] = field(default_factory=list)  # claims of a task bigger than a share

    @property
    def gpu(self) -> float:
        """The GPUs it asks for (held device by device on a host, not from a process's share)."""
        return self.resources.get("GPU", 0.0)

    @property
    def local(self) -> dict[str, float]:
        """What it takes of its process's share (all but its GPUs)."""
        return local_part(self.resources)


class TaskScheduler:
    """The tasks of one context, under the controller's lock: those waiting for their ref arguments, the queue,
    and those sent to a process (`Proc.outstanding`)."""

    def __init__(
        self, lock: threading.RLock, ids: Ids, directory: ObjectDirectory, pool: ProcessPool, streams: StreamRegistry
    ) -> None:
        self.lock = lock
        self.ids = ids
        self.directory = directory
        self.pool = pool
        self.streams = streams
        self.tasks: dict[str, Task] = {}
        self.queue: deque[Task] = deque()

    def submit(
        self,
        fn_key: str,
        fn_data: bytes,
        args: WireValue,
        deps: list[str],
        request: TaskRequest,
        keep: list[Any],
        proc_key: str | None = None,
    ) -> RefPayload:
        """A new task (from the driver, or from the worker process proc_key, which holds its ref); it is queued
        once its ref arguments (deps) are done."""
        with self.lock:
            entry, payload = self.directory.new(self.ids.object())
            if proc_key is not None:
                entry.remote[proc_key] = 1
            options = request.options
            task = Task(
                entry.id, fn_key, fn_data, args, deps, request.resource_dict(), options, keep, options.max_retries
            )
            if options.runtime_env is not None and options.runtime_env.env:
                task.env_key = tuple(sorted(options.runtime_env.env.items()))
            self.tasks[task.id] = task
            if options.streaming:
                self.streams.open(task.id, lambda: task.proc)
            dep_entries = [self.directory.get(d) for d in deps]
            if not dep_entries:
                task.state = TaskState.QUEUED
                self.queue.append(task)
                self.pump()
            else:
                self.directory.when(dep_entries, len(dep_entries), lambda: self._deps_ready(task, dep_entries))
            return payload

    def _deps_ready(self, task: Task, deps: list[Entry]) -> None:
        with self.lock:
            if task.state != TaskState.WAITING:
                return
            failed = first_failure([dep.outcome for dep in deps])
            if failed is not None:
                self.finish(task, None, deps[failed].error)
                return
            task.dep_values = [dep.stored() for dep in deps]
            task.state = TaskState.QUEUED
            self.queue.append(task)
            self.pump()

    def _pick_proc(self, task: Task, env_key: EnvKey | None = None, host: int | None = None) -> Proc | None:
        """The least loaded process with room for the task (of `env_key`, default the task's; on `host`)."""
        best, best_load = None, None
        env_key = task.env_key if env_key is None else env_key
        for proc in self.pool.procs:
            if not proc.alive or proc.dedicated or proc.env_key != env_key or not proc.fits_at_all(task.local):
                continue
            if host is not None and proc.host != host:
                continue
            load = len(proc.outstanding) - proc.blocked
            if load >= proc.slots + PREFETCH:
                continue
            if best_load is None or load < best_load:
                best, best_load = proc, load
        return best

    def _bigger_than_a_share(self, task: Task) -> bool:
        """A task asking more than one general process's share of its host (a host's CPUs, say): it runs in a
        process sized for it, its resources claimed from the host's general processes (node = host)."""
        return bool(task.local) and not fits(self.pool.share, task.local)

    def _place_sized(self, task: Task, env_key: EnvKey, hosts: list[int] | None = None) -> Proc | None:
        """Under the lock: a process sized for a task bigger than a share (of `env_key` plus its size), on a host
        whose general processes' free shares can hold it now (claimed from them until it ends)."""
        for host in self.pool.live_hosts() if hosts is None else hosts:
            reserved = self.pool.reserve(host, task.local)
            if reserved is None:
                continue
            sized = self.pool.sized_env_key(env_key, task.local)
            self.pool.ensure_env(sized, host)
            proc = self._pick_proc(task, sized, host)
            if proc is None:
                self.pool.unreserve(reserved)
                continue
            task.reserved = reserved
            return proc
        return None

    def _place_gpu_task(self, task: Task) -> Proc | None:
        """Under the lock: devices for a task that asks for GPUs, and a process that sees them: a general process
        whose devices can hold it, else a process of its own for exactly the devices chosen (more than one
        general process sees, or a task with env vars), started on first use and kept as env processes are."""
        for host in self.pool.live_hosts():
            devices = self.pool.devices[host]
            if not task.env_key:
                # the devices the host would give it (fractions pack onto the fullest device), on a general
                # process that sees them, the least loaded first
                best = devices.choose(task.gpu)
                for general in sorted(self.pool.general(host), key=lambda p: len(p.outstanding) - p.blocked):
                    busy = len(general.outstanding) - general.blocked >= general.slots + PREFETCH
                    if not best or busy or not general.fits_at_all(task.local) or not set(best) <= set(general.gpus):
                        continue
                    task.gpus = devices.take(task.gpu, among=best) or ()
                    return general
            chosen = devices.choose(task.gpu)
            if not chosen:
                continue
            env_key = self.pool.gpu_env_key(task.env_key, chosen)
            if self._bigger_than_a_share(task):
                proc = self._place_sized(task, env_key, [host])
            else:
                self.pool.ensure_env(env_key, host)
                proc = self._pick_proc(task, env_key, host)
            if proc is not None:
                task.gpus = devices.take(task.gpu, among=chosen) or ()
                return proc
        return None

    def _release_holds(self, task: Task) -> None:
        """Under the lock, as the task leaves its process: its devices, and what it claimed of its host's
        general processes (a task bigger than a share), are free again."""
        if task.gpus and task.proc is not None:
            self.pool.devices[task.proc.host].give(task.gpus, task.gpu)
        task.gpus = ()
        self.pool.unreserve(task.reserved)
        task.reserved = []

    def pump(self) -> None:
        """Under the lock: send queued tasks to processes with room, in batches."""
        if self.pool.closed:
            return
        if self.queue and not self.pool.live_hosts():  # nowhere to run, ever: fail rather than wait for good
            why = "; ".join(sorted(set(self.pool.lost_hosts.values())))
            while self.queue:
                task = self.queue.popleft()
                self.finish(task, None, WorkerCrashedError(f"task {task.id} cannot run: every host is lost: {why}"))
            return
        batches: dict[str, tuple[Proc, list[Any]]] = {}
        skipped: list[Task] = []
        while self.queue:
            task = self.queue[0]
            if task.gpu or self._bigger_than_a_share(task):
                proc = self._place_gpu_task(task) if task.gpu else self._place_sized(task, task.env_key)
                if proc is None:  # no devices, or no host room, free for it now: let the others by
                    skipped.append(self.queue.popleft())
                    if len(skipped) > 64:
                        break
                    continue
            else:
                self.pool.ensure_env(task.env_key)
                proc = self._pick_proc(task)
            if proc is None:
                fits = any(
                    not p.dedicated and p.env_key == task.env_key and p.fits_at_all(task.local) for p in self.pool.procs
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
                task.local,
                task.options.streaming,
                task.options.name,
                task.gpus,
            )
            batches.setdefault(proc.key, (proc, []))[1].append(item)
        self.queue.extendleft(reversed(skipped))
        for proc, batch in batches.values():
            try:
                proc.worker.run.broadcast(batch)
            except Exception:
                runtime.log.exception("fray: could not send tasks to %s", proc.key)
        if not self.queue:
            self._take_back()

    def _take_back(self) -> None:
        """Under the lock, with nothing left to send: if a process has a free slot while another has tasks
        queued behind its running ones (sent ahead, PREFETCH), take those back to run them on the free one.
        Without this a short task could wait behind a long one while a CPU idles."""
        for proc in self.pool.procs:
            queued_there = len(proc.outstanding) - proc.blocked - proc.slots
            if queued_there <= 0 or proc.taking_back or not proc.alive or proc.dedicated:
                continue
            room = sum(
                max(0, p.slots - (len(p.outstanding) - p.blocked))
                for p in self.pool.procs
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
            runtime.on_done(fut, partial(self._taken_back, proc))

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
                self._release_holds(task)
                task.proc, task.state = None, TaskState.QUEUED
                self.queue.appendleft(task)
            self.pump()

    def blocked(self, proc_key: str, delta: int) -> None:
        """Under the lock: a task of that process waits in get/wait (+1: its resources are lent there) or no
        longer does (-1)."""
        proc = self.pool.by_key(proc_key)
        if proc is not None:
            proc.blocked += delta
            if delta < 0:
                self.pump()

    # ------------------------------------------------------------ results
    def result(self, proc_key: str, result: TaskResult) -> None:
        """Under the lock: a worker's report of one task."""
        tid = result.id
        task = self.tasks.get(tid)
        if task is None or task.proc is None or task.proc.key != proc_key:
            return  # a late report from a process we already gave up on
        task.proc.outstanding.discard(tid)
        self._release_holds(task)
        if result.status == TaskStatus.OK and result.value is not None:
            try:
                check_owner(tid, result.value.value, proc_key)
            except FrayError as refused:
                runtime.log.error("fray: a task result was refused: %s", refused)
                self.finish(task, None, refused)
                return
            self.finish(task, result.value.value, None, result.value.contained)
        elif result.status == TaskStatus.CANCELLED:
            self.finish(task, None, TaskCancelledError(f"task {tid} was cancelled"))
        else:
            payload = result.error
            if task.retries_left != 0 and isinstance(payload, RemoteError) and not task.cancelled:
                exc = payload.rebuild()
                if task.options.should_retry(exc):
                    task.retries_left -= 1
                    task.proc, task.state = None, TaskState.QUEUED
                    self.queue.append(task)
                    return
            self.finish(task, None, payload)

    def stream_ended(self, proc_key: str, sid: str) -> None:
        """Under the lock: the streaming task `sid` of that process reported its end (its items came before)."""
        task = self.tasks.get(sid)
        if task is not None and task.proc is not None and task.proc.key == proc_key:
            task.proc.outstanding.discard(task.id)
            self.finish(task, None, None)

    def finish(self, task: Task, value: Value | None, error: Any, contained: tuple[str, ...] = ()) -> None:
        """Under the lock: the task is over; its object completes (a stream ends, with the error if any)."""
        task.state = TaskState.DONE
        if task.proc is not None:
            task.proc.outstanding.discard(task.id)
            self._release_holds(task)
        self.tasks.pop(task.id, None)
        if task.options.streaming:
            if error is not None:  # it ended without reporting its end: the stream ends with the error
                self.streams.task_failed(task.id, error)
            return
        entry = self.directory.entries.get(task.id)
        if entry is not None:
            self.directory.complete(entry, value, error, contained)

    def proc_died(self, proc: Proc, reason: str) -> None:
        """Under the lock: the tasks sent to a dead process run again where they have retries left (a stream
        that has produced items is not run again), else fail with WorkerCrashedError."""
        for tid in list(proc.outstanding):
            task = self.tasks.get(tid)
            if task is None:
                continue
            self._release_holds(task)
            if task.retries_left != 0 and not (task.options.streaming and self.streams.started(tid)):
                task.retries_left -= 1
                task.proc, task.state = None, TaskState.QUEUED
                self.queue.appendleft(task)
            else:
                self.finish(task, None, WorkerCrashedError(f"task {tid} failed: {reason}"))

    # ------------------------------------------------------------ cancelling
    def drop_unstarted(self, tid: str) -> bool:
        """Under the lock: a task that has not been sent yet never will be (its stream's consumer has gone).
        False if it was sent already (or is no task)."""
        task = self.tasks.get(tid)
        if task is None or task.state not in (TaskState.WAITING, TaskState.QUEUED):
            return False
        if task in self.queue:
            self.queue.remove(task)
        self.finish(task, None, None)
        return True

    def cancel(self, oid: str) -> None:
        with self.lock:
            task = self.tasks.get(oid)
            if task is None:
                return  # finished, an actor call, or a put: nothing to cancel
            if task.state in (TaskState.WAITING, TaskState.QUEUED):
                if task in self.queue:
                    self.queue.remove(task)
                self.finish(task, None, TaskCancelledError(f"task {oid} was cancelled before it ran"))
            elif task.state == TaskState.DISPATCHED and task.proc is not None:
                task.cancelled = True
                worker = task.proc.worker
            else:
                return
        try:  # not under the lock: the worker's answer must not wait for it
            worker.cancel.call_one(oid).get(timeout=30)
        except Exception:
            pass

    def clear(self) -> None:
        """Under the lock, at shutdown."""
        self.tasks.clear()
        self.queue.clear()
