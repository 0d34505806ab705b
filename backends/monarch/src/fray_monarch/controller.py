"""The controller: object table, task scheduling over worker processes, actor registry, failure handling.

Lives in the client process. The MonarchJobContext calls it directly; workers reach it through the Coordinator
actor (same process), so both see one state under one lock.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monarch.actor import this_proc

from fray.context import task_resources
from fray.errors import (
    ActorAlreadyExistsError,
    ActorDiedError,
    ActorNotFoundError,
    ActorUnavailableError,
    FrayError,
    TaskCancelledError,
    WorkerCrashedError,
)
from fray.refs import public_methods
from fray.serialization import Blob, RemoteError, loads
from fray.types import ActorOptions, TaskOptions, normalize_resources
from fray_monarch import _runtime
from fray_monarch.actors import Coordinator, FrayActorHost, WorkerHost
from fray_monarch.objects import RefPayload, Tracker, owner_key, set_tracker
from fray_monarch.worker_runtime import rebuild_error

FREE_GRACE = 2.0  # an unreferenced object is dropped this long after its last reference goes
MAX_ENV_PROCS = 4  # processes kept for tasks with their own env vars
PREFETCH = 4  # tasks sent to a process beyond its slots, queued there, to hide the round trip

_controllers: dict[str, Controller] = {}


def controller(key: str) -> Controller:
    ctl = _controllers.get(key)
    if ctl is None:
        raise FrayError(f"the fray-monarch context {key} is shut down")
    return ctl


def _on_first(oid: str, arrived: bool) -> None:
    pass


def _on_zero(oid: str) -> None:
    ctl = _controllers.get(owner_key(oid))
    if ctl is not None:
        ctl.maybe_free(oid)


def _send(port: Any, message: Any) -> None:
    """Reply to a worker; it may have died meanwhile (nothing to tell then)."""
    try:
        port.send(message)
    except Exception:
        _runtime.log.debug("fray: reply to a gone worker dropped", exc_info=True)


TRACKER = Tracker(_on_first, _on_zero)
set_tracker(TRACKER)


@dataclass
class Entry:
    """One object: pending, a value blob, or an error. `future` is an unresolved actor-call reply."""

    id: str
    done: threading.Event = field(default_factory=threading.Event)
    value: tuple[bytes, list[bytes]] | None = None
    error: Any = None
    future: Any = None
    actor: Any = None
    keep: list[Any] = field(default_factory=list)  # payloads this object or its pending call keeps alive
    callbacks: list[Callable[[Entry], None]] = field(default_factory=list)
    remote: dict[str, int] = field(default_factory=dict)  # proc key -> holds
    watched: bool = False
    free_armed: bool = False


@dataclass
class Task:
    id: str
    fn_key: str
    fn_data: bytes
    args: tuple[bytes, list[bytes]]
    deps: list[str]
    resources: dict[str, float]
    options: TaskOptions
    keep: list[Any]
    retries_left: int
    proc: Proc | None = None
    dep_values: list[Any] | None = None
    env_key: tuple[tuple[str, str], ...] = ()
    state: str = "waiting"
    cancelled: bool = False


@dataclass
class Proc:
    key: str
    host: int
    mesh: Any
    worker: Any
    capacity: dict[str, float]
    claims: dict[str, float] = field(default_factory=dict)
    outstanding: set[str] = field(default_factory=set)
    blocked: int = 0
    actors: set[str] = field(default_factory=set)
    fns_sent: set[str] = field(default_factory=set)
    alive: bool = True
    env_key: tuple[tuple[str, str], ...] = ()  # non-empty: a process that only runs tasks with exactly this env

    @property
    def free_capacity(self) -> dict[str, float]:
        return {k: self.capacity.get(k, 0.0) - self.claims.get(k, 0.0) for k in set(self.capacity) | set(self.claims)}

    @property
    def slots(self) -> int:
        return max(1, math.floor(self.free_capacity.get("CPU", 0.0) + 1e-9))

    def fits_at_all(self, res: dict[str, float]) -> bool:
        free = self.free_capacity
        return all(free.get(k, 0.0) >= q - 1e-9 for k, q in res.items())


@dataclass
class ActorRec:
    id: str
    name: str | None
    class_name: str
    methods: frozenset[str]
    cls_data: bytes
    args: tuple[bytes, list[bytes]]
    deps: list[str]
    keep: list[Any]
    options: ActorOptions
    resources: dict[str, float]
    proc: Proc | None = None
    mesh: Any = None
    restarts: int = 0
    state: str = "alive"  # alive | dead
    reason: str = ""

    @property
    def can_restart(self) -> bool:
        return self.options.max_restarts == -1 or self.restarts < self.options.max_restarts


class Controller:
    def __init__(self, hosts: list[Any], procs_per_host: int, host_resources: dict[str, float]) -> None:
        self.key = uuid.uuid4().hex[:10]
        self.lock = threading.RLock()
        self.ids = itertools.count()
        self.entries: dict[str, Entry] = {}
        self.tasks: dict[str, Task] = {}
        self.queue: deque[Task] = deque()
        self.procs: list[Proc] = []
        self.actors: dict[str, ActorRec] = {}
        self.names: dict[str, str] = {}
        self.hosts = hosts
        self.procs_per_host = procs_per_host
        self.share = {k: v / procs_per_host for k, v in host_resources.items()}
        self.fn_cache: dict[int, tuple[Any, str, bytes]] = {}
        self.closed = False
        self.free_due: deque[tuple[float, str]] = deque()  # (when, object id), in deadline order
        self.sweep_armed = False
        self.sys_path = [p for p in sys.path if p]
        if os.getcwd() not in self.sys_path:
            self.sys_path.insert(0, os.getcwd())
        _controllers[self.key] = self
        self.coord = this_proc().spawn(f"fray_coord_{self.key}", Coordinator, self.key)
        for host in range(len(hosts)):
            for _ in range(procs_per_host):
                self._spawn_proc(host)
        for proc in list(self.procs):
            proc.worker.ping.call_one().get(timeout=120)

    # ------------------------------------------------------------ processes
    def _spawn_proc(self, host: int, env_key: tuple[tuple[str, str], ...] = ()) -> Proc:
        key = f"p{next(self.ids)}"
        mesh = self.hosts[host].spawn_procs(per_host={"procs": 1}, name=f"fray_{self.key}_{key}")
        nodes = self.node_resources()
        worker = mesh.spawn(
            "fray_worker", WorkerHost, self.key, key, self.coord, dict(self.share), nodes, self.sys_path, dict(env_key)
        )
        proc = Proc(key, host, mesh, worker, dict(self.share), env_key=env_key)
        self.procs.append(proc)
        _runtime.on_done(worker.watch.call_one(), lambda _v, exc, p=proc: self._proc_died(p, exc))
        _runtime.on_done(worker.ping.call_one(), lambda v, exc, p=proc: self._watch_pid(p, v, exc))
        return proc

    def _watch_pid(self, proc: Proc, reply: Any, exc: BaseException | None) -> None:
        """A process on this machine is also watched by its pid: its exit is seen at once, even when Monarch's
        supervision poll raced the death (that path can take HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE)."""
        if exc is not None or not isinstance(reply, tuple) or not reply[1] or reply[1] != _runtime.machine_id():
            return
        pid = reply[0]
        _runtime.watch_pid(pid, lambda: self._proc_died(proc, RuntimeError(f"its process (pid {pid}) exited")))

    def node_resources(self) -> list[dict[str, float]]:
        return [dict(self.share) for _ in range(len(self.hosts) * self.procs_per_host)]

    def _proc_died(self, proc: Proc, exc: BaseException | None) -> None:
        with self.lock:
            if self.closed or not proc.alive:
                return
            proc.alive = False
            self.procs.remove(proc)
            reason = f"worker process {proc.key} died ({str(exc).splitlines()[0] if exc else 'stopped'})"
            for entry in self.entries.values():
                entry.remote.pop(proc.key, None)
            if not proc.env_key:  # env processes come back on demand
                self._spawn_proc(proc.host)  # a fresh proc mesh: never spawn on one that lost a process
            for tid in list(proc.outstanding):
                task = self.tasks.get(tid)
                if task is None:
                    continue
                if task.retries_left != 0:
                    task.retries_left -= 1
                    task.proc, task.state = None, "queued"
                    self.queue.appendleft(task)
                else:
                    self._finish_task(task, None, WorkerCrashedError(f"task {tid} failed: {reason}"))
            for aid in list(proc.actors):
                rec = self.actors[aid]
                if rec.can_restart:
                    rec.restarts += 1
                    self._place_actor(rec)
                else:
                    self._actor_dead(rec, f"its process crashed: {reason}")
            self._pump()

    # ------------------------------------------------------------ objects
    def new_entry(self) -> tuple[Entry, RefPayload]:
        oid = f"{self.key}-{next(self.ids)}"
        entry = Entry(oid)
        self.entries[oid] = entry
        return entry, RefPayload(oid)

    def entry(self, oid: str) -> Entry:
        entry = self.entries.get(oid)
        if entry is None:
            raise FrayError(f"object {oid} is gone (freed after its last reference was dropped, or shut down)")
        return entry

    def _complete(self, entry: Entry, value: Any, error: Any) -> None:
        """Under the lock. Set the result once and run callbacks."""
        if entry.done.is_set():
            return
        entry.value, entry.error = value, error
        entry.future = None
        entry.keep = []
        entry.done.set()
        callbacks, entry.callbacks = entry.callbacks, []
        for cb in callbacks:
            try:
                cb(entry)
            except Exception:  # e.g. replying to a worker that died meanwhile: must not stop the others
                _runtime.log.exception("fray: completion callback failed")

    def _keep_ids(self, ids: list[str] | None) -> list[RefPayload]:
        return [RefPayload(i) for i in ids or ()]

    def put_blob(self, blob: Blob) -> RefPayload:
        with self.lock:
            entry, payload = self.new_entry()
            entry.keep = list(blob.contained)
            self._complete(entry, (blob.data, blob.buffers), None)
        return payload

    def put_remote(self, proc_key: str, blob_wire: Any) -> str:
        with self.lock:
            entry, payload = self.new_entry()
            entry.keep = self._keep_ids(blob_wire[2])
            self._complete(entry, (blob_wire[0], blob_wire[1]), None)
            entry.remote[proc_key] = 1
            return payload.id

    def maybe_free(self, oid: str) -> None:
        with self.lock:
            entry = self.entries.get(oid)
            if entry is None or entry.free_armed or self.closed:
                return
            entry.free_armed = True
            self.free_due.append((time.monotonic() + FREE_GRACE, oid))
            if self.sweep_armed:
                return
            self.sweep_armed = True
        _runtime.call_later(FREE_GRACE, self._sweep)

    def _sweep(self) -> None:
        """One timer for all pending frees (a timer per object cost ~0.1 ms of every actor call)."""
        with self.lock:
            now = time.monotonic()
            while self.free_due and self.free_due[0][0] <= now:
                self._free_if_unreferenced(self.free_due.popleft()[1])
            if not self.free_due or self.closed:
                self.sweep_armed = False
                return
            delay = max(0.05, self.free_due[0][0] - now)
        _runtime.call_later(delay, self._sweep)

    def _free_if_unreferenced(self, oid: str) -> None:
        with self.lock:
            entry = self.entries.get(oid)
            if entry is None:
                return
            entry.free_armed = False
            if TRACKER.counts.get(oid, 0) > 0 or any(n > 0 for n in entry.remote.values()):
                return
            del self.entries[oid]
            entry.keep = []

    def on_worker_report(self, proc_key: str, results: list[Any], holds: list[str], releases: list[str]) -> None:
        with self.lock:
            for oid in holds:
                entry = self.entries.get(oid)
                if entry is not None:
                    entry.remote[proc_key] = entry.remote.get(proc_key, 0) + 1
            for tid, status, payload, _ in results:
                try:
                    self._task_result(proc_key, tid, status, payload)
                except Exception:
                    _runtime.log.exception("fray: bad task result %s", tid)
            for oid in releases:
                entry = self.entries.get(oid)
                if entry is not None and entry.remote.get(proc_key, 0) > 0:
                    entry.remote[proc_key] -= 1
                    if not any(entry.remote.values()) and TRACKER.counts.get(oid, 0) == 0:
                        self.maybe_free(oid)
            self._pump()

    # ------------------------------------------------------------ waiting on entries
    def watch(self, entry: Entry) -> None:
        """Under the lock: make sure an actor-call entry completes by itself (for wait and remote get)."""
        if entry.future is None or entry.watched:
            return
        entry.watched = True
        _runtime.on_done(entry.future, lambda v, exc, e=entry: self._resolve_reply(e, v, exc))

    def _resolve_reply(self, entry: Entry, reply: Any, exc: BaseException | None) -> None:
        with self.lock:
            if entry.done.is_set():
                return
            rec = entry.actor
            if exc is not None:
                if rec is not None and (rec.state == "dead" or not rec.can_restart):
                    why = rec.reason or "its process crashed"
                    self._complete(entry, None, ActorDiedError(f"actor {rec.class_name} {rec.id} died: {why}"))
                else:
                    name = rec.class_name if rec else "?"
                    self._complete(
                        entry,
                        None,
                        ActorUnavailableError(f"actor {name}'s process crashed during this call; it is restarting"),
                    )
            elif reply[0] == "ok":
                self._complete(entry, (reply[1][0], reply[1][1]), None)
                entry.keep = self._keep_ids(reply[1][2])
            elif reply[0] == "dead":
                name = rec.class_name if rec else ""
                self._complete(entry, None, ActorDiedError(f"actor {name} is dead: {reply[1]}"))
            else:
                self._complete(entry, None, reply[1])

    def resolve(self, entry: Entry, timeout: float | None) -> bool:
        """Wait for entry (not under the lock). Actor replies are read directly from their Monarch future."""
        fut = entry.future
        if fut is not None and not entry.done.is_set():
            try:
                reply = fut.get(timeout=timeout)
            except TimeoutError:
                return False
            except Exception as exc:
                self._resolve_reply(entry, None, exc)
            else:
                self._resolve_reply(entry, reply, None)
            return True
        return entry.done.wait(timeout)

    @staticmethod
    def error_of(entry: Entry) -> BaseException:
        return rebuild_error(entry.error)

    @staticmethod
    def value_of(entry: Entry) -> Any:
        assert entry.value is not None
        return loads(Blob(entry.value[0], entry.value[1]))

    def add_waiter(self, entries: list[Entry], need: int, on_ready: Callable[[], None]) -> Callable[[], None]:
        """Call on_ready once `need` of entries are done. Returns a function that unregisters it."""
        state = {"count": 0, "fired": False}

        def cb(_entry: Entry) -> None:
            state["count"] += 1
            if state["count"] >= need and not state["fired"]:
                state["fired"] = True
                on_ready()

        with self.lock:
            pending = []
            for entry in entries:
                if entry.done.is_set():
                    state["count"] += 1
                else:
                    pending.append(entry)
            if state["count"] >= need:
                state["fired"] = True
                on_ready()
                return lambda: None
            for entry in pending:
                entry.callbacks.append(cb)
                self.watch(entry)

        def remove() -> None:
            with self.lock:
                for entry in pending:
                    if cb in entry.callbacks:
                        entry.callbacks.remove(cb)

        return remove

    # ------------------------------------------------------------ requests from workers
    def _blocked(self, proc_key: str, delta: int) -> None:
        for proc in self.procs:
            if proc.key == proc_key:
                proc.blocked += delta
                if delta < 0:
                    self._pump()

    def get_remote(self, port: Any, proc_key: str, oids: list[str], timeout: float | None) -> None:
        entries = [self.entry(o) for o in oids]
        replied = threading.Event()

        def reply() -> None:
            if replied.is_set():
                return
            replied.set()
            with self.lock:
                self._blocked(proc_key, -1)
            errors = [e.error for e in entries if e.error is not None]
            if errors:
                _send(port, ("err", errors[0]))
            else:
                _send(port, ("ok", [(e.value[0], e.value[1]) for e in entries if e.value is not None]))

        def timed_out() -> None:
            if not replied.is_set():
                replied.set()
                remove()
                with self.lock:
                    self._blocked(proc_key, -1)
                _send(port, ("timeout",))

        with self.lock:
            self._blocked(proc_key, +1)
            self._pump()
        remove = self.add_waiter(entries, len(entries), reply)
        if timeout is not None and not replied.is_set():
            _runtime.call_later(timeout, timed_out)

    def wait_remote(self, port: Any, proc_key: str, oids: list[str], num_returns: int, timeout: float | None) -> None:
        entries = [self.entry(o) for o in oids]
        replied = threading.Event()

        def reply() -> None:
            if not replied.is_set():
                replied.set()
                with self.lock:
                    self._blocked(proc_key, -1)
                _send(port, ("ok", [i for i, e in enumerate(entries) if e.done.is_set()]))

        with self.lock:
            self._blocked(proc_key, +1)
            self._pump()
        remove = self.add_waiter(entries, num_returns, reply)
        if timeout is not None and not replied.is_set():
            _runtime.call_later(timeout, lambda: (remove(), reply()))

    # ------------------------------------------------------------ tasks
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
        args: tuple[bytes, list[bytes]],
        deps: list[str],
        options: TaskOptions,
        keep: list[Any],
        proc_key: str | None = None,
    ) -> RefPayload:
        with self.lock:
            entry, payload = self.new_entry()
            if proc_key is not None:
                entry.remote[proc_key] = 1
            retries = options.max_retries
            task = Task(entry.id, fn_key, fn_data, args, deps, task_resources(options), options, keep, retries)
            if options.runtime_env is not None and options.runtime_env.env:
                task.env_key = tuple(sorted(options.runtime_env.env.items()))
            self.tasks[task.id] = task
            dep_entries = [self.entry(d) for d in deps]
            if not dep_entries:
                task.state = "queued"
                self.queue.append(task)
                self._pump()
            else:
                self.add_waiter(dep_entries, len(dep_entries), lambda: self._deps_ready(task, dep_entries))
            return payload

    def submit_remote(self, proc_key: str, fn_data: bytes, args_wire: Any, deps: list[str], options: Any) -> str:
        import hashlib

        key = hashlib.sha1(fn_data).hexdigest()
        keep = self._keep_ids(args_wire[2]) + self._keep_ids(deps)
        return self.submit(key, fn_data, (args_wire[0], args_wire[1]), deps, options, keep, proc_key).id

    def _deps_ready(self, task: Task, deps: list[Entry]) -> None:
        with self.lock:
            if task.state != "waiting":
                return
            for dep in deps:
                if dep.error is not None:
                    self._finish_task(task, None, dep.error)
                    return
            task.dep_values = [d.value for d in deps]
            task.state = "queued"
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
            if not proc.alive or proc.env_key != task.env_key or not proc.fits_at_all(task.resources):
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
                fits = any(p.env_key == task.env_key and p.fits_at_all(task.resources) for p in self.procs)
                if fits or len(skipped) > 64:
                    break  # everything is busy: wait for a completion
                skipped.append(self.queue.popleft())  # fits nowhere right now (actors hold it): let others by
                continue
            self.queue.popleft()
            task.proc, task.state = proc, "sent"
            proc.outstanding.add(task.id)
            fn_data = None if task.fn_key in proc.fns_sent else task.fn_data
            proc.fns_sent.add(task.fn_key)
            item = (task.id, task.fn_key, fn_data, task.args, task.dep_values or [], None, task.resources)
            batches.setdefault(proc.key, (proc, []))[1].append(item)
        self.queue.extendleft(reversed(skipped))
        for proc, batch in batches.values():
            try:
                proc.worker.run.broadcast(batch)
            except Exception:
                _runtime.log.exception("fray: could not send tasks to %s", proc.key)

    def _task_result(self, proc_key: str, tid: str, status: str, payload: Any) -> None:
        task = self.tasks.get(tid)
        if task is None or task.proc is None or task.proc.key != proc_key:
            return  # a late report from a process we already gave up on
        task.proc.outstanding.discard(tid)
        if status == "ok":
            self._finish_task(task, (payload[0], payload[1]), None, payload[2])
        elif status == "cancelled":
            self._finish_task(task, None, TaskCancelledError(f"task {tid} was cancelled"))
        else:
            if task.retries_left != 0 and isinstance(payload, RemoteError) and not task.cancelled:
                exc = payload.rebuild()
                if task.options.should_retry(exc):
                    task.retries_left -= 1
                    task.proc, task.state = None, "queued"
                    self.queue.append(task)
                    return
            self._finish_task(task, None, payload)

    def _finish_task(self, task: Task, value: Any, error: Any, contained: list[str] | None = None) -> None:
        task.state = "done"
        if task.proc is not None:
            task.proc.outstanding.discard(task.id)
        self.tasks.pop(task.id, None)
        entry = self.entries.get(task.id)
        if entry is not None:
            self._complete(entry, value, error)
            entry.keep = self._keep_ids(contained)

    def cancel(self, oid: str) -> None:
        with self.lock:
            task = self.tasks.get(oid)
            if task is None:
                return  # finished, an actor call, or a put: nothing to cancel
            if task.state in ("waiting", "queued"):
                if task in self.queue:
                    self.queue.remove(task)
                self._finish_task(task, None, TaskCancelledError(f"task {oid} was cancelled before it ran"))
            elif task.state == "sent" and task.proc is not None:
                task.cancelled = True
                worker = task.proc.worker
            else:
                return
        try:  # not under the lock: the worker's answer must not wait for it
            worker.cancel.call_one(oid).get(timeout=30)
        except Exception:
            pass

    # ------------------------------------------------------------ actors
    def create_actor(
        self,
        cls_data: bytes,
        class_name: str,
        methods: frozenset[str],
        args: tuple[bytes, list[bytes]],
        deps: list[str],
        keep: list[Any],
        options: ActorOptions,
    ) -> tuple[str, str, frozenset[str], str | None]:
        with self.lock:
            if options.name is not None:
                existing = self.names.get(options.name)
                if existing is not None and self.actors[existing].state != "dead":
                    if options.get_if_exists:
                        rec = self.actors[existing]
                        return rec.id, rec.class_name, rec.methods, rec.name
                    raise ActorAlreadyExistsError(f"an actor named {options.name!r} exists already")
            aid = f"{self.key}-a{next(self.ids)}"
            rec = ActorRec(
                aid,
                options.name,
                class_name,
                methods,
                cls_data,
                args,
                deps,
                keep,
                options,
                normalize_resources(options.resources),
            )
            self.actors[aid] = rec
            if options.name is not None:
                self.names[options.name] = aid
            self._place_actor(rec)
            return aid, class_name, methods, options.name

    def create_actor_remote(
        self, proc_key: str, cls_data: bytes, args_wire: Any, deps: list[str], options: ActorOptions
    ) -> tuple[str, str, frozenset[str], str | None]:
        klass = loads(Blob(cls_data))
        keep = self._keep_ids(args_wire[2]) + self._keep_ids(deps)
        return self.create_actor(
            cls_data, klass.__name__, public_methods(klass), (args_wire[0], args_wire[1]), deps, keep, options
        )

    def _place_actor(self, rec: ActorRec) -> None:
        """Under the lock: spawn the actor on the least loaded live process that can hold its resources."""
        pool = [p for p in self.procs if p.alive and not p.env_key]
        candidates = [p for p in pool if p.fits_at_all(rec.resources)] or pool
        proc = min(candidates, key=lambda p: (len(p.actors), len(p.outstanding)))
        rec.proc = proc
        proc.actors.add(rec.id)
        if rec.resources:
            for k, q in rec.resources.items():
                proc.claims[k] = proc.claims.get(k, 0.0) + q
            proc.worker.set_capacity.broadcast(proc.free_capacity)
        nodes = self.node_resources()
        rec.mesh = proc.mesh.spawn(
            f"fray_actor_{rec.id}_{rec.restarts}",
            FrayActorHost,
            self.key,
            proc.key,
            self.coord,
            dict(self.share),
            nodes,
            self.sys_path,
            rec.options.max_concurrency,
        )
        init = rec.mesh.init.call_one(rec.cls_data, rec.args, rec.deps)
        _runtime.on_done(init, lambda _v, _e: None)

    def _actor_dead(self, rec: ActorRec, reason: str) -> None:
        rec.state, rec.reason = "dead", reason
        if rec.name is not None and self.names.get(rec.name) == rec.id:
            del self.names[rec.name]
        proc = rec.proc
        if proc is not None:
            proc.actors.discard(rec.id)
            if rec.resources:
                for k, q in rec.resources.items():
                    proc.claims[k] = proc.claims.get(k, 0.0) - q
                if proc.alive:
                    proc.worker.set_capacity.broadcast(proc.free_capacity)
        rec.keep = []
        self._pump()

    def actor(self, aid: str) -> ActorRec:
        rec = self.actors.get(aid)
        if rec is None:
            raise ActorDiedError(f"unknown actor {aid}")
        return rec

    def call_actor(
        self,
        aid: str,
        method: str,
        args: tuple[bytes, list[bytes]],
        deps: list[str],
        keep: list[Any],
        proc_key: str | None = None,
    ) -> RefPayload:
        with self.lock:
            rec = self.actor(aid)
            entry, payload = self.new_entry()
            entry.actor = rec
            if proc_key is not None:
                entry.remote[proc_key] = 1
            if rec.state == "dead":
                self._complete(entry, None, ActorDiedError(f"actor {rec.class_name} {aid} is dead: {rec.reason}"))
                return payload
            entry.future = rec.mesh.call.call_one(method, args, deps)
            entry.keep = keep
            return payload

    def call_actor_remote(self, proc_key: str, aid: str, method: str, args_wire: Any, deps: list[str]) -> str:
        keep = self._keep_ids(args_wire[2]) + self._keep_ids(deps)
        return self.call_actor(aid, method, (args_wire[0], args_wire[1]), deps, keep, proc_key).id

    def get_actor_info(self, name: str) -> tuple[str, str, frozenset[str], str | None]:
        with self.lock:
            aid = self.names.get(name)
            if aid is None or self.actors[aid].state == "dead":
                raise ActorNotFoundError(f"no live actor named {name!r}")
            rec = self.actors[aid]
            return rec.id, rec.class_name, rec.methods, rec.name

    def kill_actor(self, aid: str) -> None:
        with self.lock:
            rec = self.actor(aid)
            if rec.state == "dead":
                return
            self._actor_dead(rec, "it was killed")
            mesh = rec.mesh
        try:
            _runtime.on_done(mesh.stop(), lambda _v, _e: None)
        except Exception:
            pass

    def debug_state(self) -> str:
        with self.lock:
            procs = [
                (p.key, p.alive, len(p.outstanding), p.blocked, p.slots, p.env_key, len(p.actors)) for p in self.procs
            ]
            queued = [(t.id, t.state, t.resources, t.env_key) for t in list(self.queue)[:5]]
            workers = []
            for p in self.procs:
                try:
                    workers.append(p.worker.state.call_one().get(timeout=3))
                except Exception as exc:
                    workers.append(repr(exc))
            return (
                f"workers={workers} procs={procs} queue={len(self.queue)} {queued} tasks={len(self.tasks)} "
                f"entries={len(self.entries)}"
            )

    # ------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            procs = list(self.procs)
            for entry in self.entries.values():
                if not entry.done.is_set() and entry.future is None:
                    self._complete(entry, None, FrayError("the fray-monarch context was shut down"))
        stops = []
        for proc in procs:
            proc.alive = False
            try:
                stops.append(proc.mesh.stop())
            except Exception:
                pass
        deadline = time.monotonic() + 20
        for fut in stops:
            try:
                fut.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                pass
        try:
            self.coord.stop().get(timeout=5)
        except Exception:
            pass
        with self.lock:
            self.entries.clear()
            self.tasks.clear()
            self.queue.clear()
        _controllers.pop(self.key, None)
