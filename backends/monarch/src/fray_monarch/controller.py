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
    TaskCancelledError,
    WorkerCrashedError,
)
from fray.refs import public_methods
from fray.serialization import Blob, RemoteError, loads
from fray.transfers import PathStats, merge
from fray.types import ActorOptions, TaskOptions, normalize_resources
from fray_monarch import _runtime, instances
from fray_monarch.actors import Coordinator, FrayActorHost, WorkerHost
from fray_monarch.directory import Entry, ObjectDirectory
from fray_monarch.objects import RefPayload, Tracker, owner_key, set_tracker
from fray_monarch.protocol import (
    ActorReply,
    Inline,
    StoreConfig,
    Stored,
    TaskItem,
    TaskResult,
    Value,
    WireValue,
    WorkerSetup,
)
from fray_monarch.store import ObjectStore, reclaim_dead_segments, remove_segments
from fray_monarch.worker_runtime import rebuild_error

MAX_ENV_PROCS = 4  # processes kept for tasks with their own env vars
PREFETCH = 4  # tasks sent to a process beyond its slots, queued there, to hide the round trip


def _on_first(oid: str, arrived: bool) -> None:
    pass


def _on_zero(oid: str) -> None:
    ctl = instances.lookup(owner_key(oid))
    if ctl is not None:
        ctl.objects.maybe_free(oid)


def _send(port: Any, message: Any) -> None:
    """Reply to a worker; it may have died meanwhile (nothing to tell then)."""
    try:
        port.send(message)
    except Exception:
        _runtime.log.debug("fray: reply to a gone worker dropped", exc_info=True)


TRACKER = Tracker(_on_first, _on_zero)
set_tracker(TRACKER)


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
    state: str = "waiting"
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
    args: WireValue
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
    """Processes, task scheduling and actors of one context, over the object directory (directory.py)."""

    def __init__(
        self, hosts: list[Any], procs_per_host: int, host_resources: dict[str, float], stores: StoreConfig
    ) -> None:
        self.key = uuid.uuid4().hex[:10]
        self.lock = threading.RLock()
        self.ids = itertools.count()
        self.objects = ObjectDirectory(self.key, self.lock, TRACKER, self._free_stored, self.watch)
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
        self.stores = stores
        self.sys_path = [p for p in sys.path if p]
        if os.getcwd() not in self.sys_path:
            self.sys_path.insert(0, os.getcwd())
        reclaim_dead_segments()  # files of earlier drivers or workers that were killed
        self.store = ObjectStore(
            self.key,
            "local",
            "driver",
            stores.budget,
            stores.driver_bind,
            RefPayload,
            stores.inline_limit,
            stores.transport,
            several_hosts=stores.host_ids != ("local",),
        )
        instances.register(self.key, self)
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
        setup = self._worker_setup(host, key)
        worker = mesh.spawn("fray_worker", WorkerHost, setup, dict(env_key))
        proc = Proc(key, host, mesh, worker, dict(self.share), env_key=env_key)
        self.procs.append(proc)
        _runtime.on_done(worker.watch.call_one(), lambda _v, exc, p=proc: self._proc_died(p, exc))
        _runtime.on_done(worker.ping.call_one(), lambda v, exc, p=proc: self._watch_pid(p, v, exc))
        return proc

    def _worker_setup(self, host: int, proc_key: str) -> WorkerSetup:
        return WorkerSetup(
            ctl_key=self.key,
            proc_key=proc_key,
            coord=self.coord,
            capacity=dict(self.share),
            nodes=self.node_resources(),
            sys_path=self.sys_path,
            host_id=self.stores.host_ids[host],
            bind_host=self.stores.bind_hosts[host],
            store_budget=self.stores.budget,
            inline_limit=self.stores.inline_limit,
            transport=self.stores.transport,
        )

    def _watch_pid(self, proc: Proc, reply: Any, exc: BaseException | None) -> None:
        """A process on this machine is also watched by its pid: its exit is seen at once, even when Monarch's
        supervision poll raced the death (that path can take HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE)."""
        if exc is not None or not isinstance(reply, tuple) or not reply[1] or reply[1] != _runtime.machine_id():
            return
        pid = proc.pid = reply[0]
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
            self.objects.forget_holder(proc.key)
            self.objects.mark_lost(proc.key, f"it was stored by {reason}")
            if proc.pid:
                reclaim_dead_segments()  # its shared memory (mappings readers already have stay valid)
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
    def new_oid(self) -> str:
        return f"{self.key}-{next(self.ids)}"

    def entry(self, oid: str) -> Entry:
        return self.objects.get(oid)

    def put_blob(self, blob: Blob) -> RefPayload:
        """A value made in the driver: stored in the driver's store (large) or inline."""
        with self.lock:
            entry, payload = self.objects.new(self.new_oid())
        value = self.store.encode(blob, entry.id)
        with self.lock:
            self.objects.complete(entry, value, None)
            entry.keep = list(blob.contained)
        return payload

    def encode_call(self, blob: Blob) -> tuple[WireValue, list[Any]]:
        """The arguments of a call from the driver, and what the call must keep alive. Large arguments are
        stored like a put (their object lives as long as the call needs it)."""
        contained = tuple(p.id for p in blob.contained if isinstance(p, RefPayload))
        if blob.nbytes < self.stores.inline_limit:
            return WireValue(Inline.of(blob), contained), list(blob.contained)
        payload = self.put_blob(blob)
        return WireValue(self.objects.get(payload.id).value, contained), [payload, *blob.contained]  # type: ignore[arg-type]

    def put_remote(self, proc_key: str, oid: str, wire: WireValue) -> str:
        """A value made by a worker (its put, or large call arguments), under the id the worker chose."""
        with self.lock:
            entry, _ = self.objects.new(oid)
            entry.remote[proc_key] = 1
            self.objects.complete(entry, wire.value, None, wire.contained)
            return oid

    def _free_stored(self, values: list[Stored]) -> None:
        """Under the lock: the owners of these allocations free them (their memory is reused)."""
        by_owner: dict[str, list[int]] = {}
        for value in values:
            by_owner.setdefault(value.owner, []).append(value.alloc)
        for owner, allocs in by_owner.items():
            if owner == "driver":
                self.store.free(allocs)
                continue
            for proc in self.procs:
                if proc.key == owner and proc.alive:
                    try:
                        proc.worker.free.broadcast(allocs)
                    except Exception:
                        _runtime.log.debug("fray: free on %s not sent", owner, exc_info=True)

    def on_worker_report(self, proc_key: str, results: list[TaskResult], holds: list[str], releases: list[str]) -> None:
        with self.lock:
            self.objects.hold(proc_key, holds)
            for result in results:
                try:
                    self._task_result(proc_key, result)
                except Exception:
                    _runtime.log.exception("fray: bad task result %s", result.id)
            self.objects.release(proc_key, releases)
            self._pump()

    def transfer_stats(self) -> dict[str, PathStats]:
        parts = [self.store.stats.snapshot()]
        with self.lock:
            procs = [p for p in self.procs if p.alive]
        futures = [p.worker.transfer_stats.call_one() for p in procs]
        for fut in futures:
            try:
                parts.append(fut.get(timeout=30))
            except Exception:
                _runtime.log.debug("fray: transfer stats of a worker not read", exc_info=True)
        return merge(*parts)

    # ------------------------------------------------------------ waiting on entries
    def watch(self, entry: Entry) -> None:
        """Under the lock: make sure an actor-call entry completes by itself (for wait and remote get)."""
        if entry.future is None or entry.watched:
            return
        entry.watched = True
        _runtime.on_done(entry.future, lambda v, exc, e=entry: self._resolve_reply(e, v, exc))

    def _resolve_reply(self, entry: Entry, reply: ActorReply | None, exc: BaseException | None) -> None:
        with self.lock:
            if entry.done.is_set():
                return
            rec = entry.actor
            if exc is not None or reply is None:
                if rec is not None and (rec.state == "dead" or not rec.can_restart):
                    why = rec.reason or "its process crashed"
                    self.objects.complete(entry, None, ActorDiedError(f"actor {rec.class_name} {rec.id} died: {why}"))
                else:
                    name = rec.class_name if rec else "?"
                    self.objects.complete(
                        entry,
                        None,
                        ActorUnavailableError(f"actor {name}'s process crashed during this call; it is restarting"),
                    )
            elif reply.status == "ok" and reply.value is not None:
                self.objects.complete(entry, reply.value.value, None, reply.value.contained)
            elif reply.status == "dead":
                name = rec.class_name if rec else ""
                self.objects.complete(entry, None, ActorDiedError(f"actor {name} is dead: {reply.reason}"))
            else:
                self.objects.complete(entry, None, reply.error)

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

    def value_of(self, entry: Entry) -> Any:
        assert entry.value is not None
        return self.store.load(entry.value)

    def add_waiter(self, entries: list[Entry], need: int, on_ready: Callable[[], None]) -> Callable[[], None]:
        return self.objects.add_waiter(entries, need, on_ready)

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
                _send(port, ("ok", [e.value for e in entries]))

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
            dep_entries = [self.entry(d) for d in deps]
            if not dep_entries:
                task.state = "queued"
                self.queue.append(task)
                self._pump()
            else:
                self.add_waiter(dep_entries, len(dep_entries), lambda: self._deps_ready(task, dep_entries))
            return payload

    def submit_remote(self, proc_key: str, fn_data: bytes, args: WireValue, deps: list[str], options: Any) -> str:
        import hashlib

        key = hashlib.sha1(fn_data).hexdigest()
        keep = [RefPayload(i) for i in (*args.contained, *deps)]
        return self.submit(key, fn_data, args, deps, options, keep, proc_key).id

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
            item = TaskItem(task.id, task.fn_key, fn_data, task.args, tuple(task.dep_values or ()), task.resources)
            batches.setdefault(proc.key, (proc, []))[1].append(item)
        self.queue.extendleft(reversed(skipped))
        for proc, batch in batches.values():
            try:
                proc.worker.run.broadcast(batch)
            except Exception:
                _runtime.log.exception("fray: could not send tasks to %s", proc.key)

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
                    task.proc, task.state = None, "queued"
                    self.queue.append(task)
                    return
            self._finish_task(task, None, payload)

    def _finish_task(self, task: Task, value: Value | None, error: Any, contained: tuple[str, ...] = ()) -> None:
        task.state = "done"
        if task.proc is not None:
            task.proc.outstanding.discard(task.id)
        self.tasks.pop(task.id, None)
        entry = self.objects.entries.get(task.id)
        if entry is not None:
            self.objects.complete(entry, value, error, contained)

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
        args: WireValue,
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
        self, proc_key: str, cls_data: bytes, args: WireValue, deps: list[str], options: ActorOptions
    ) -> tuple[str, str, frozenset[str], str | None]:
        klass = loads(Blob(cls_data))
        keep = [RefPayload(i) for i in (*args.contained, *deps)]
        return self.create_actor(cls_data, klass.__name__, public_methods(klass), args, deps, keep, options)

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
        rec.mesh = proc.mesh.spawn(
            f"fray_actor_{rec.id}_{rec.restarts}",
            FrayActorHost,
            self._worker_setup(proc.host, proc.key),
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
        args: WireValue,
        deps: list[str],
        keep: list[Any],
        proc_key: str | None = None,
    ) -> RefPayload:
        with self.lock:
            rec = self.actor(aid)
            entry, payload = self.objects.new(self.new_oid())
            entry.actor = rec
            if proc_key is not None:
                entry.remote[proc_key] = 1
            if rec.state == "dead":
                error = ActorDiedError(f"actor {rec.class_name} {aid} is dead: {rec.reason}")
                self.objects.complete(entry, None, error)
                return payload
            entry.future = rec.mesh.call.call_one(entry.id, method, args, deps)
            entry.keep = keep
            return payload

    def call_actor_remote(self, proc_key: str, aid: str, method: str, args: WireValue, deps: list[str]) -> str:
        keep = [RefPayload(i) for i in (*args.contained, *deps)]
        return self.call_actor(aid, method, args, deps, keep, proc_key).id

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
                f"entries={len(self.objects.entries)}"
            )

    # ------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            procs = list(self.procs)
        self.objects.close()
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
            self.objects.clear()
            self.tasks.clear()
            self.queue.clear()
        self.store.close()
        remove_segments(f"fray.{self.key}.")  # every host of this context on this machine
        instances.unregister(self.key)
