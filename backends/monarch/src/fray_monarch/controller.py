"""The controller of one context: worker processes and their failures, and the objects of the driver; with its
parts for tasks (scheduler.py), actors (actor_registry.py) and worker requests (service.py).

Lives in the client process. The MonarchJobContext calls it directly; workers reach it through the Coordinator
actor (same process), so both see one state under one lock.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import threading
import time
import uuid
from collections import deque
from typing import Any

from monarch.actor import Channel, this_proc

from fray import watchdog
from fray.errors import (
    FrayError,
    WorkerCrashedError,
)
from fray.remote_errors import rebuild
from fray.serialization import Blob
from fray.states import TaskState
from fray.transfers import PathStats, merge
from fray_monarch import _runtime, instances
from fray_monarch.actor_registry import ActorRec, ActorRegistry
from fray_monarch.actors import Coordinator, WorkerHost
from fray_monarch.arena import SHM_DIR, reclaim_dead_segments, remove_segments
from fray_monarch.directory import Entry, ObjectDirectory
from fray_monarch.lifeline import LifelineServer
from fray_monarch.meshgroups import GroupRec, GroupRegistry
from fray_monarch.objects import RefPayload, Tracker, owner_key, set_tracker
from fray_monarch.protocol import (
    Inline,
    ProcInfo,
    StoreConfig,
    Stored,
    WireValue,
    WorkerSetup,
)
from fray_monarch.scheduler import Proc, Task, TaskScheduling
from fray_monarch.service import WorkerService
from fray_monarch.store import ObjectStore
from fray_monarch.streaming import StreamRec, StreamRegistry


def _on_first(oid: str, arrived: bool) -> None:
    pass


def _on_zero(oid: str) -> None:
    ctl = instances.lookup(owner_key(oid))
    if ctl is not None:
        ctl.objects.maybe_free(oid)


TRACKER = Tracker(_on_first, _on_zero)
set_tracker(TRACKER)


class Controller(TaskScheduling, ActorRegistry, GroupRegistry, StreamRegistry, WorkerService):
    """Processes and objects of one context; tasks (scheduler.py), actors (actor_registry.py) and requests from
    workers (service.py) are its other parts."""

    def __init__(
        self,
        hosts: list[Any],
        procs_per_host: int,
        host_resources: dict[str, float],
        stores: StoreConfig,
        host_mesh: Any = None,
        log_to_driver: bool = True,
    ) -> None:
        self.key = uuid.uuid4().hex[:10]
        # log_to_driver=false: worker processes write their output to this file of the private directory instead
        # of the console (the context removes it at shutdown)
        self.log_file = None if log_to_driver else os.path.join(_runtime.private_dir(), f"worker-output-{self.key}.log")
        self.lock = threading.RLock()
        self.ids = itertools.count()
        self.objects = ObjectDirectory(self.key, self.lock, TRACKER, self._free_stored, self.watch)
        self.tasks: dict[str, Task] = {}
        self.queue: deque[Task] = deque()
        self.procs: list[Proc] = []
        self.actors: dict[str, ActorRec] = {}
        self.names: dict[str, str] = {}
        self.streams: dict[str, StreamRec] = {}
        self.groups: dict[str, GroupRec] = {}
        self.inflight: dict[str, Entry] = {}  # group-broadcast calls not answered yet
        self.host_mesh = host_mesh  # all attached hosts as one mesh (a group spread over them is one mesh)
        self.reply_port, self.reply_receiver = Channel.open()  # where group members answer broadcasts
        self.reply_thread: threading.Thread | None = None
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
        # This context's store files on this machine (the driver's and its local workers') and their lock file
        # go with this process however it ends; a clean shutdown removes them itself.
        self.shm_prefix = os.path.join(SHM_DIR, f"fray.{self.key}.")
        watchdog.watch_prefix(self.shm_prefix)
        # The TMPDIR of the processes spawned on this host (Monarch's socket directories, the tasks' temp files):
        # removed at shutdown, or with the driver's private directory by the watchdog.
        self.tmpdir = _runtime.context_dir() if stores.host_ids == ("local",) else None
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
        # processes on other hosts end with this driver (the watchdog cannot reach them): see lifeline.py
        self.lifeline = LifelineServer(stores.driver_bind) if stores.host_ids != ("local",) else None
        instances.register(self.key, self)
        self.coord = this_proc().spawn(f"fray_coord_{self.key}", Coordinator, self.key)
        for host in range(len(hosts)):
            for _ in range(procs_per_host):
                self._spawn_proc(host)
        for proc in list(self.procs):
            proc.worker.ping.call_one().get(timeout=120)

    # ------------------------------------------------------------ processes
    def _spawn_proc(self, host: int, env_key: tuple[tuple[str, str], ...] = (), dedicated: str = "") -> Proc:
        """A fresh proc mesh of one worker process: a general one, one for tasks with env vars (env_key), or the
        process of one actor (dedicated: the actor's id; it runs no tasks and holds none of the host's share)."""
        key = f"p{next(self.ids)}"
        boot = {"bootstrap_command": _runtime.bootstrap_command(self.tmpdir)} if self.tmpdir else {}
        mesh = self.hosts[host].spawn_procs(per_host={"procs": 1}, name=f"fray_{self.key}_{key}", **boot)
        capacity = {} if dedicated else dict(self.share)
        setup = self._worker_setup(host, key, capacity)
        worker = mesh.spawn("fray_worker", WorkerHost, setup, dict(env_key))
        proc = Proc(key, host, mesh, worker, capacity, env_key=env_key, dedicated=dedicated)
        self.procs.append(proc)
        self._watch_proc(proc)
        return proc

    def _watch_proc(self, proc: Proc) -> None:
        """Under the lock: learn of proc's death (Monarch supervision, and its pid where it runs here)."""
        _runtime.on_done(proc.worker.watch.call_one(), lambda _v, exc, p=proc: self._proc_died(p, exc))
        _runtime.on_done(proc.worker.ping.call_one(), lambda v, exc, p=proc: self._watch_pid(p, v, exc))

    def _worker_setup(self, host: int, proc_key: str, capacity: dict[str, float] | None = None) -> WorkerSetup:
        return WorkerSetup(
            ctl_key=self.key,
            proc_key=proc_key,
            coord=self.coord,
            capacity=dict(self.share) if capacity is None else capacity,
            nodes=self.node_resources(),
            sys_path=self.sys_path,
            host_id=self.stores.host_ids[host],
            bind_host=self.stores.bind_hosts[host],
            store_budget=self.stores.budget,
            inline_limit=self.stores.inline_limit,
            transport=self.stores.transport,
            log_file=self.log_file,
            lifeline=None if self.lifeline is None else (self.lifeline.address, self.lifeline.token),
            driver_host=self.stores.driver_bind,
        )

    def _watch_pid(self, proc: Proc, reply: Any, exc: BaseException | None) -> None:
        """A process on this machine is also watched by its pid: its exit is seen at once, even when Monarch's
        supervision poll raced the death (that path can take HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE)."""
        if exc is not None or not isinstance(reply, ProcInfo) or not reply.machine:
            return
        if reply.machine != _runtime.machine_id():
            return
        pid = proc.pid = reply.pid
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
            if proc.general:  # env processes come back on demand; an actor's own process with the actor
                self._spawn_proc(proc.host)  # a fresh proc mesh: never spawn on one that lost a process
            for tid in list(proc.outstanding):
                task = self.tasks.get(tid)
                if task is None:
                    continue
                if task.retries_left != 0 and not (task.options.streaming and self.stream_started(tid)):
                    task.retries_left -= 1  # (a stream that has produced items is not run again)
                    task.proc, task.state = None, TaskState.QUEUED
                    self.queue.appendleft(task)
                else:
                    self._finish_task(task, None, WorkerCrashedError(f"task {tid} failed: {reason}"))
            for aid in list(proc.actors):
                rec = self.actors[aid]
                if rec.can_restart:
                    rec.restarts += 1
                    self._place_actor(rec)
                    self._fail_inflight(rec, RuntimeError(reason))  # -> ActorUnavailableError
                else:
                    self._actor_dead(rec, f"its process crashed: {reason}")
            self._pump()

    def _start_replies(self) -> None:
        """Under the lock: start reading group members' answers (with the first group)."""
        if self.reply_thread is None:
            self.reply_thread = _runtime.receive_each(self.reply_receiver, self._group_answer, "fray-monarch-replies")

    def _group_answer(self, message: tuple[str, bytes | None, Any]) -> None:
        if self.closed:
            return
        try:
            self.group_reply(message)
        except Exception:
            _runtime.log.exception("fray: bad group member answer %r", message[:1])

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

    def watch(self, entry: Entry) -> None:
        """Under the lock: make sure an actor-call entry completes by itself (for wait and remote get)."""
        if entry.future is None or entry.watched:
            return
        entry.watched = True
        _runtime.on_done(entry.future, lambda v, exc, e=entry: self._resolve_reply(e, v, exc))

    def resolve(self, entry: Entry, timeout: float | None) -> bool:
        """Wait for entry (not under the lock). Actor replies are read directly from their Monarch future."""
        fut = entry.future
        if fut is not None and not entry.outcome.done():
            try:
                reply = fut.get(timeout=timeout)
            except TimeoutError:
                return False
            except Exception as exc:
                self._resolve_reply(entry, None, exc)
            else:
                self._resolve_reply(entry, reply, None)
            return True
        return entry.outcome.wait(timeout)

    @staticmethod
    def error_of(entry: Entry) -> BaseException:
        return rebuild(entry.error)

    def value_of(self, entry: Entry) -> Any:
        assert entry.value is not None
        return self.store.load(entry.value, f"the value of object {entry.id}")

    # ------------------------------------------------------------ shutdown
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

    def abandon(self) -> None:
        """At interpreter exit without shutdown(): stop reacting to anything (the watchdog removes the files)."""
        with self.lock:
            self.closed = True

    def shutdown(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            procs = list(self.procs)
        self.objects.close()
        stops = []
        meshes: set[int] = set()  # a group's members share one proc mesh: stopped once
        for proc in procs:
            proc.alive = False
            if id(proc.mesh) in meshes:
                continue
            meshes.add(id(proc.mesh))
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
        if self.reply_thread is not None:
            self.reply_port.send(None)  # ends the reader
            self.reply_thread.join(timeout=2)
        if self.lifeline is not None:  # after the stops: any process they missed ends now
            self.lifeline.close()
        with self.lock:
            for stream in list(self.streams.values()):
                self._end_stream(stream, FrayError("the fray-monarch context was shut down"))
            self.streams.clear()
            self.objects.clear()
            self.tasks.clear()
            self.queue.clear()
        try:
            self.store.close()
        finally:  # the files go even if closing the store failed
            remove_segments(f"fray.{self.key}.")  # every host of this context on this machine
            watchdog.forget_prefix(self.shm_prefix)
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
            instances.unregister(self.key)
