"""The controller of one context, in the driver: a thin facade over its parts, which it builds in order, each
given the parts it needs (one owner per piece of state, all under one lock):

- ids (ids.py): every id the context hands out;
- the object directory (directory.py): objects, their outcomes, refcounts and frees;
- the process pool (processes.py): worker processes, their share of the hosts, their deaths;
- streams (streaming.py), the task scheduler (scheduler.py), actors (actor_registry.py), groups (meshgroups.py);
- the worker service (service.py): what workers ask through the Coordinator actor (same process).

The controller itself owns the driver's store and what spans the parts: a process's death, a stream's consumer
leaving, and shutdown.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from typing import Any

from monarch.actor import this_proc

from fray.backend import RECORDER, HostGpus, Kind, PathStats, end_children, merge, watchdog
from fray.errors import FrayError
from fray_monarch.core import runtime, tempdirs
from fray_monarch.core.objects import RefPayload, Tracker, owner_key, set_tracker
from fray_monarch.core.protocol import StoreConfig, Stored
from fray_monarch.data.arena import reclaim_dead_segments, remove_segments, shm_dir
from fray_monarch.data.store import ObjectStore
from fray_monarch.driver import instances, process_reads
from fray_monarch.driver.actor_registry import ActorRegistry
from fray_monarch.driver.coordinator import Coordinator
from fray_monarch.driver.directory import ObjectDirectory
from fray_monarch.driver.gangs import GangKeeper
from fray_monarch.driver.ids import Ids
from fray_monarch.driver.meshgroups import GroupRegistry
from fray_monarch.driver.proc_rec import Proc
from fray_monarch.driver.processes import ProcessPool
from fray_monarch.driver.scheduler import TaskScheduler
from fray_monarch.driver.service import WorkerService
from fray_monarch.driver.streaming import StreamRegistry


def _on_zero(oid: str) -> None:
    ctl = instances.lookup(owner_key(oid))
    if ctl is not None:
        ctl.directory.maybe_free(oid)


TRACKER = Tracker(None, _on_zero)  # (the driver tells nobody of a ref's arrival: its directory is here)
set_tracker(TRACKER)


class Controller:
    """Processes, objects, tasks, actors, groups and streams of one context."""

    def __init__(
        self,
        hosts: list[Any],
        procs_per_host: int,
        host_resources: dict[str, float],
        stores: StoreConfig,
        host_mesh: Any = None,
        log_to_driver: bool = True,
        host_addresses: list[str] | None = None,
        gpus: HostGpus | None = None,
    ) -> None:
        self.key = key = uuid.uuid4().hex[:10]
        self._told_lost: set[int] = set()  # lost hosts the user was told of
        # log_to_driver=false: worker processes write their output to this file of the private directory instead
        # of the console (the context removes it at shutdown)
        self.log_file = None if log_to_driver else os.path.join(tempdirs.private_dir(), f"worker-output-{key}.log")
        self.lock = lock = threading.RLock()
        reclaim_dead_segments()  # files of earlier drivers or workers that were killed
        # This context's store files on this machine (the driver's and its local workers') and their lock file
        # go with this process however it ends; a clean shutdown removes them itself.
        self.shm_prefix = os.path.join(shm_dir(), f"fray.{key}.")
        watchdog.watch_prefix(self.shm_prefix)
        self.ids = ids = Ids(key)
        self.pool = ProcessPool(
            ids,
            lock,
            hosts,
            procs_per_host,
            host_resources,
            stores,
            host_mesh,
            self.log_file,
            self._proc_died,
            host_addresses,
            gpus,
        )
        self.store = ObjectStore(
            key,
            "local",
            "driver",
            stores.budget,
            stores.driver_bind,
            RefPayload,
            stores.inline_limit,
            stores.transport,
            several_hosts=stores.host_ids != ("local",),
        )
        self.directory = ObjectDirectory(key, lock, TRACKER, self._free_stored)
        self.streams = StreamRegistry(lock, ids, self.directory, self.pool)
        self.events = process_reads.EventPuller(self.pool)
        self.transfers = process_reads.TransferTally(self.pool)
        self.scheduler = TaskScheduler(lock, ids, self.directory, self.pool, self.streams)
        self.actors = ActorRegistry(lock, ids, self.directory, self.pool, self.streams, self.scheduler.pump)
        self.groups = GroupRegistry(lock, ids, self.directory, self.pool, self.actors)
        self.gangs = GangKeeper(lock, self.directory, self.pool, self.actors, self.groups)  # SPMD groups fail as one
        self.service = WorkerService(
            lock, self.directory, self.scheduler, self.streams, self.actors, self.groups, self.close_stream
        )
        instances.register(key, self)
        self.coord = this_proc().spawn(f"fray_coord_{key}", Coordinator, key)
        self.pool.start(self.coord)

    # ------------------------------------------------------------ what spans the parts
    def _proc_died(self, proc: Proc, exc: BaseException | None) -> None:
        """A worker process died: what it stored is lost, its tasks run again or fail, its actors restart or
        die, and a general process is replaced (on a fresh proc mesh: never spawn on one that lost a process)."""
        with self.lock:
            if self.pool.closed or not self.pool.forget(proc):
                return
            if self.pool.stores.host_ids[proc.host] != "local":
                self.pool.doubted.add(proc.host)  # (its host may be lost: probed before a group is placed)
            reason = f"worker process {proc.key} died ({str(exc).splitlines()[0] if exc else 'stopped'})"
            RECORDER.record(Kind.WORKER_DIED, proc.key, proc.role, {"reason": reason, "host": proc.host})
            self.directory.forget_holder(proc.key)
            self.directory.mark_lost(proc.key, f"it was stored by {reason}")
            if proc.pid:
                reclaim_dead_segments()  # its shared memory (mappings readers already have stay valid)
            if proc.general:  # env processes come back on demand; an actor's own process with the actor
                self._replace(proc.host)
            self.scheduler.proc_died(proc, reason)
            self.actors.proc_died(proc, reason)
            self.scheduler.pump()

    def _replace(self, host: int) -> None:
        """Under the lock: a general process of `host` comes back, on a fresh process; on another machine only once
        its host worker answers (its own thread probes it), never on a host that is lost."""
        if self.pool.stores.host_ids[host] == "local":
            self.pool.spawn(host)
            return

        def probe_then_spawn() -> None:
            why = self.pool.host_lost(host)
            with self.lock:
                if self.pool.closed:
                    return
                if why is None:
                    self.pool.spawn(host)
                    return
                self.scheduler.pump()  # (with no host left, queued tasks fail now instead of waiting for good)
                first = host not in self._told_lost
                self._told_lost.add(host)
            if first:  # (once per host, not once per process it had)
                print(f"fray: {why}: its work goes to the other hosts from now on", file=sys.stderr, flush=True)

        threading.Thread(target=probe_then_spawn, name="fray-monarch-replace", daemon=True).start()

    def close_stream(self, sid: str) -> None:
        """The consumer of a stream has gone: drop what it did not read, and stop the producer at its next item
        (a streaming task that has not started never will)."""
        with self.lock:
            rec = self.streams.consumer_gone(sid)
            if rec is None:
                return
            if self.scheduler.drop_unstarted(sid):  # a streaming task that has not started
                self.streams.end(rec)
                return
            self.streams.stop_producer(rec, rec.producer())

    def _free_stored(self, values: list[Stored]) -> None:
        """Under the lock: the owners of these allocations free them (their memory is reused)."""
        by_owner: dict[str, list[int]] = {}
        for value in values:
            by_owner.setdefault(value.owner, []).append(value.alloc)
        for owner, allocs in by_owner.items():
            if owner == "driver":
                self.store.free(allocs)
            else:
                self.pool.free(owner, allocs)

    def transfer_stats(self) -> dict[str, PathStats]:
        return merge(self.store.stats.snapshot(), *self.transfers.read())

    def node_resources(self) -> list[dict[str, float]]:
        return self.pool.node_resources()

    # ------------------------------------------------------------ shutdown
    def debug_state(self) -> str:
        with self.lock:
            procs = [
                (p.key, p.alive, len(p.outstanding), p.blocked, p.slots, p.env_key, len(p.actors))
                for p in self.pool.procs
            ]
            queue = self.scheduler.queue
            queued = [(t.id, t.state, t.resources, t.env_key) for t in list(queue)[:5]]
            workers = []
            for p in self.pool.procs:
                try:
                    workers.append(p.worker.state.call_one().get(timeout=3))
                except Exception as exc:
                    workers.append(repr(exc))
            return (
                f"workers={workers} procs={procs} queue={len(queue)} {queued} tasks={len(self.scheduler.tasks)} "
                f"entries={len(self.directory.entries)}"
            )

    def abandon(self) -> None:
        """At interpreter exit without shutdown(): stop reacting to anything (the watchdog removes the files), and
        end this context's threads in this process while Python can still run them (_end_driver_threads)."""
        with self.lock:
            if self.pool.closed:
                return
            self.pool.closed = True
        self._end_driver_threads()

    def _end_driver_threads(self) -> None:
        """Stop the coordinator (which joins its thread) and the reader of group members' answers: both wait in
        Monarch's native code, and one that wakes while the interpreter finalizes is ended by unwinding through
        those frames, which aborts the process instead of letting it exit with the program's status."""
        try:
            self.coord.stop().get(timeout=5)
        except Exception as exc:  # (at exit, or the context ending: nothing is left to report it to)
            runtime.log.debug("fray: the coordinator did not stop: %r", exc)
        self.groups.close()

    def shutdown(self) -> None:
        with self.lock:
            if self.pool.closed:
                return
            procs = self.pool.close()
        self.directory.close()
        self.pool.stop(procs)
        self._end_driver_threads()
        self.pool.release()  # after the stops: any process they missed ends now
        # A stop that failed or timed out (Monarch's, on a loaded machine) must not leave this context's
        # processes behind: those of this machine still running are SIGKILLed, proven ours first.
        left = end_children(self.pool.started_here)
        if left:
            runtime.log.warning("fray: worker processes %s outlived the shutdown of their context", left)
        with self.lock:
            self.streams.close_all(FrayError("the fray-monarch context was shut down"))
            self.directory.clear()
            self.scheduler.clear()
        try:
            self.store.close()
        finally:  # the files go even if closing the store failed
            remove_segments(f"fray.{self.key}.")  # every host of this context on this machine
            watchdog.forget_prefix(self.shm_prefix)
            self.pool.remove_tmpdir()
            instances.unregister(self.key)
