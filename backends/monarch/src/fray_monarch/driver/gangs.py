"""SPMD groups on monarch fail and restart as one (see fray.runtime.gang), a part of the Controller.

`ActorRegistry.proc_died` hands a member's death here (`gang_died`). The group's every process is stopped (a
survivor blocked in a collective cannot leave it otherwise) and every call pending on any member fails with the
group's error. With a restart left (`ActorOptions.max_restarts`) that error is ActorUnavailableError and every
member comes back on a fresh process of its own (never on the group's mesh: Monarch hangs spawning on a mesh
that lost a process), with a new MASTER_PORT on rank 0's host, `fray.current_actor().restarts` counting, and
__init__ sent to every rank at once (their init_process_group meets); calls made until every __init__ has
returned wait (`GroupRec.waiting`) and are sent then, or fail with the group's ActorDiedError if it dies. Without a
restart left, or when an __init__ of the restart fails, the group is dead (ActorDiedError naming the rank). A
member whose process leaves a ping unanswered for FRAY_SPMD_HANG_TIMEOUT seconds (stopped, or its machine gone
quiet; fray.runtime.gang.hang_timeout) counts as dead the same way.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import threading
import time
from functools import partial
from typing import Any

from fray.backend import RECORDER, Kind, died_error, heartbeat_interval, hung, hung_reason, restarting_error
from fray.errors import ActorDiedError
from fray_monarch.core import runtime
from fray_monarch.core.protocol import ReplyStatus
from fray_monarch.driver.actor_rec import ActorRec
from fray_monarch.driver.actor_registry import ActorRegistry
from fray_monarch.driver.directory import Entry, ObjectDirectory
from fray_monarch.driver.group_rec import GroupRec
from fray_monarch.driver.meshgroups import GroupRegistry
from fray_monarch.driver.processes import ProcessPool, ignore

__all__ = ["GangKeeper"]


class GangKeeper:
    """What happens to an SPMD group when a member dies, under the controller's lock."""

    def __init__(
        self,
        lock: threading.RLock,
        directory: ObjectDirectory,
        pool: ProcessPool,
        actors: ActorRegistry,
        groups: GroupRegistry,
    ) -> None:
        self.lock = lock
        self.directory = directory
        self.pool = pool
        self.actors = actors
        self.groups = groups
        actors.gang_died = self.member_died
        groups.spmd_created = self.watch_hangs
        self._watched: list[GroupRec] = []  # SPMD groups whose members are pinged (hang detection)
        self._pings: dict[str, float] = {}  # process key -> when its unanswered ping was sent
        self._pinger: threading.Thread | None = None

    # ------------------------------------------------------------ hangs
    def watch_hangs(self, group: GroupRec) -> None:
        """Under the lock: ping the group's members' processes (their WorkerHost answers, also while the member
        is busy in a collective); one that leaves a ping unanswered for group.hang_timeout counts as dead."""
        if math.isinf(group.hang_timeout):
            return
        self._watched.append(group)
        if self._pinger is None or not self._pinger.is_alive():
            self._pinger = threading.Thread(target=self._ping_loop, name="fray-monarch-gang-pings", daemon=True)
            self._pinger.start()

    def _ping_loop(self) -> None:
        while True:
            with self.lock:
                self._watched = [g for g in self._watched if not g.dead]
                if not self._watched or self.pool.closed:
                    self._pinger = None
                    return
                interval = min(heartbeat_interval(g.hang_timeout) for g in self._watched)
                now = time.monotonic()
                for group in self._watched:
                    if group.error is not None:
                        continue  # restarting: its new processes are pinged once it is back
                    if group.up_since is None and all(init.done() for init in group.inits):
                        group.up_since = now  # (after a restart, set when its last __init__ returned)
                    for member in group.members:
                        self._ping(group, member, now)
            time.sleep(interval)

    def _answered(self, key: str, _value: Any, _exc: BaseException | None) -> None:
        with self.lock:
            self._pings.pop(key, None)  # (a failed ping is a death: the process watch reports it)

    def _ping(self, group: GroupRec, member: ActorRec, now: float) -> None:
        """Under the lock."""
        proc = member.proc
        if proc is None or not proc.alive:
            return
        sent = self._pings.get(proc.key)
        if sent is None:
            self._pings[proc.key] = now
            runtime.on_done(proc.worker.ping.call_one(), partial(self._answered, proc.key))
        elif hung(sent, now, group.hang_timeout, group.up_since):
            self._pings.pop(proc.key, None)
            if proc.pid:  # (a stopped process cannot be asked to stop; on another host Monarch stops its mesh)
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.member_died(member, hung_reason(group.hang_timeout))

    def member_died(self, rec: ActorRec, reason: str, restart: bool = True) -> None:
        """Under the lock: a member of an SPMD group died (also during a restart), or was killed (restart=False:
        a kill is final, and the group cannot go on without it)."""
        group: GroupRec | None = rec.group
        if group is None or group.dead:
            return
        rank = rec.info.rank
        if not restart or not (group.max_restarts == -1 or group.restarts < group.max_restarts):
            self._die(group, rank, reason)
            return
        group.restarts += 1
        group.generation += 1
        group.up_since = None
        RECORDER.record(Kind.GROUP_RESTART, group.label, group.label, {"reason": f"rank {rank}: {reason}"})
        group.error = restarting_error(group.label, rank, reason, group.restarts, group.max_restarts)
        self._stop_all(group)
        threading.Thread(
            target=self._restart, args=(group, group.generation), name="fray-monarch-gang-restart", daemon=True
        ).start()

    def _die(self, group: GroupRec, rank: int, reason: str) -> None:
        """Under the lock: the group is dead for good; its processes are stopped and its calls failed."""
        group.dead = True
        group.generation += 1
        why = str(died_error(group.label, rank, reason))
        group.error = ActorDiedError(why)
        waiting = [held.entry for held in group.waiting]  # (calls made while it restarted: they fail too)
        group.waiting = []
        meshes = self.groups.drop(group, why)
        group.blocks = []  # (stopped here once: a later kill of the group has no mesh left to stop)
        self._stop(meshes)
        self._fail(group, [*group.held.values(), *group.calls.values(), *waiting])

    def _stop_all(self, group: GroupRec) -> None:
        """Under the lock: every member's process stopped and forgotten, every pending call failed."""
        meshes = [block.procs for block in group.blocks]
        group.blocks = []
        pending: list[Entry] = [*group.held.values(), *group.calls.values()]
        for member in group.members:
            proc = member.proc
            if proc is not None:
                proc.actors.discard(member.id)
                if self.pool.forget(proc):
                    self.directory.forget_holder(proc.key)
                    self.directory.mark_lost(proc.key, f"it was stored by actor {member.label}, whose group failed")
                if member.slot is None:  # (on a process of its own since an earlier restart)
                    meshes.append(proc.mesh)
            self.actors.holds.unclaim(member, keep_gpus=True)  # (given back if the group dies: ActorRegistry.dead)
            pending += [e for e in (self.actors.inflight.pop(oid, None) for oid in member.inflight) if e]
            member.inflight.clear()
        self._stop(meshes)
        self._fail(group, pending)

    def _fail(self, group: GroupRec, entries: list[Entry]) -> None:
        group.held, group.calls = {}, {}
        assert group.error is not None
        for entry in entries:
            if not entry.outcome.done():
                self.directory.complete(entry, None, type(group.error)(str(group.error)))

    @staticmethod
    def _stop(meshes: list[Any]) -> None:
        for mesh in {id(m): m for m in meshes}.values():
            try:
                runtime.on_done(mesh.stop(), ignore)
            except Exception:
                runtime.log.debug("fray: stop of an SPMD group's mesh failed", exc_info=True)

    # ------------------------------------------------------------ restart
    def _restart(self, group: GroupRec, generation: int) -> None:
        """(Own thread: rank 0's port may be asked of its host.) Every member on a fresh process, __init__ sent
        to every rank at once; members whose host is lost are placed on the others first."""
        if not self._off_lost_hosts(group, generation):
            return
        try:
            one_host = len({member.host for member in group.members}) == 1
            addr, port = self.groups.master_address(group.members[0].host, loopback=one_host)
        except Exception as exc:
            with self.lock:
                if group.generation == generation:
                    self._die(group, 0, f"no port for the restart's rendezvous: {exc}")
            return
        with self.lock:
            if group.dead or group.generation != generation or self.pool.closed:
                return
            group.initializing = len(group.members)
            for member in group.members:
                member.env = {**member.env, "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
                member.info = dataclasses.replace(member.info, restarts=group.restarts)
                member.restarts += 1  # (names its new Monarch actor)
                try:
                    self.actors.place(member, on_init=partial(self._initialized, group, generation, member))
                except Exception as exc:
                    self._die(group, member.info.rank, f"it could not be restarted: {exc}")
                    return

    def _off_lost_hosts(self, group: GroupRec, generation: int) -> bool:
        """(The restart's thread: probes hosts, not under the lock.) Members on a lost host get hosts that are not,
        by the group's placement; False if the group died (the other hosts cannot hold it) or moved on."""
        lost = self.pool.hosts_lost(m.host for m in group.members)
        if not lost:
            return True
        with self.lock:
            if group.dead or group.generation != generation:
                return False
            if self.groups.relayout(group):
                return True
            rank = next(m.info.rank for m in group.members if m.host in lost)
            why = "; ".join(sorted(set(lost.values())))
            room = f"the {len(self.pool.live_hosts())} other host(s) cannot hold its {len(group.members)} members"
            self._die(group, rank, f"{why}, and {room}")
            return False

    def _initialized(self, group: GroupRec, generation: int, member: ActorRec, reply: Any, exc: Any) -> None:
        """A member's __init__ of a restart returned: the group is back once every rank's has."""
        with self.lock:
            if group.dead or group.generation != generation:
                return
            error = exc if exc is not None else getattr(reply, "error", None)
            if error is not None or getattr(reply, "status", ReplyStatus.OK) != ReplyStatus.OK:
                detail = getattr(error, "message", None) or str(error)
                self._die(group, member.info.rank, f"its __init__ failed in restart {group.restarts}: {detail}")
                return
            group.initializing -= 1
            if group.initializing == 0:
                group.error = None
                group.up_since = time.monotonic()
                waiting, group.waiting = group.waiting, []
                for held in waiting:  # calls made during the restart run now
                    if not held.entry.outcome.done():
                        self.actors.send_one(*held)
