"""The actors of one context: the registry of fray actors (names, restarts, death), each a Monarch actor on a
worker process, the replies of their calls, and the streams of their generator methods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from fray.backend import (
    ENV_HELD,
    LOST_PEER_GRACE,
    RECORDER,
    ActorInfo,
    ActorRequest,
    ActorState,
    Kind,
    Member,
    ended,
    lost_peer,
)
from fray.errors import (
    ActorAlreadyExistsError,
    ActorDiedError,
    ActorNotFoundError,
    ActorUnavailableError,
    FrayError,
    InfeasibleResourcesError,
)
from fray_monarch.core import runtime
from fray_monarch.core.actor_classes import actor_host
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import ActorCall, ActorDesc, Inline, ReplyStatus, WireValue, compact, expand, plain_call
from fray_monarch.driver.actor_holds import ActorHolds
from fray_monarch.driver.actor_rec import ActorRec
from fray_monarch.driver.directory import Entry, ObjectDirectory, check_owner
from fray_monarch.driver.ids import Ids
from fray_monarch.driver.orphaned_calls import fail_after_grace
from fray_monarch.driver.proc_rec import Proc, local_part
from fray_monarch.driver.processes import ProcessPool, ignore
from fray_monarch.driver.streaming import StreamRegistry

FrayActorHost = actor_host()  # fray_monarch.workers.hosts.FrayActorHost, by name (core/actor_classes.py)
# Seconds get reads a reply straight from its Monarch future before it waits on the call's entry, which the death of
# the actor's process can complete too (orphaned_calls.py); longer calls cost one more hop through fray's loop.
FIRST_READ = 0.05


class ActorRegistry:
    """Every actor of one context, by id and by name, under the controller's lock. `resources_freed()` is called
    when a dead actor's resources are back (queued tasks may fit now)."""

    def __init__(
        self,
        lock: threading.RLock,
        ids: Ids,
        directory: ObjectDirectory,
        pool: ProcessPool,
        streams: StreamRegistry,
        resources_freed: Callable[[], None],
    ) -> None:
        self.lock = lock
        self.ids = ids
        self.directory = directory
        self.pool = pool
        self.streams = streams
        self.resources_freed = resources_freed
        self.by_id: dict[str, ActorRec] = {}
        self.names: dict[str, str] = {}  # name -> id of the live actor with that name
        self.inflight: dict[str, Entry] = {}  # group-broadcast calls not answered yet, by object id
        # a member of an SPMD group died (gangs.py): (member, why, whether its group may restart)
        self.gang_died: Callable[[ActorRec, str, bool], None] | None = None
        self.holds = ActorHolds(pool)
        self._watch = self.watch  # (bound once: every call's entry carries it)

    # ------------------------------------------------------------ replies
    def reply(self, entry: Entry, reply: Any, exc: BaseException | None) -> None:
        """An actor's answer to a call (or the failure of the call: its process died) completes its entry."""
        rec = entry.actor
        if exc is None and type(reply) is tuple:  # a plain ok reply (most of them): nothing to check in it
            with self.lock:
                if rec is not None:
                    rec.calls.pop(entry.id, None)
                self.directory.complete(entry, Inline(reply[0]), None)
            return
        reply = expand(reply)  # (compacted, or None: the process died)
        with self.lock:
            if rec is not None:
                rec.calls.pop(entry.id, None)
            if entry.outcome.done():
                return
            if exc is not None or reply is None:
                # The process died during the call. Restarting (or restarted already: the death may have been
                # handled first, counting the restart) -> unavailable; no restart left -> dead.
                restarted = rec is not None and rec.restarts > entry.actor_restarts
                if rec is not None and not restarted and rec.proc is not None:
                    rec.proc.died_in_a_call = True  # (a call made before the death's news waits: wait_for_restart)
                if rec is not None and not restarted and (rec.state == ActorState.DEAD or not rec.can_restart):
                    why = rec.reason or "its process crashed"
                    failure: Exception = ActorDiedError(f"actor {rec.label} died: {why}")
                else:
                    name = rec.label if rec else "?"
                    failure = ActorUnavailableError(
                        f"actor {name}: its process crashed during this call; it is restarting"
                    )
                self.directory.complete(entry, None, failure)
                # (its process, and the call's own events with it, are gone: its end is recorded here)
                RECORDER.record(Kind.CALL_END, entry.id, rec.class_name if rec else "?", ended(failure))
            elif reply.status == ReplyStatus.OK and reply.value is not None:
                try:  # the reply came from the actor's process: a value it stored must be in that process's store
                    if rec is not None and rec.proc is not None:
                        check_owner(entry.id, reply.value.value, rec.proc.key)
                except FrayError as exc:
                    runtime.log.error("fray: an actor's reply was refused: %s", exc)
                    self.directory.complete(entry, None, exc)
                    return
                self.directory.complete(entry, reply.value.value, None, reply.value.contained)
            elif reply.status == ReplyStatus.DEAD:
                name = rec.label if rec else ""
                self.directory.complete(entry, None, ActorDiedError(f"actor {name} is dead: {reply.reason}"))
            elif rec is None or not self.hold(rec, entry, reply.error):
                self.directory.complete(entry, None, reply.error)

    def hold(self, rec: ActorRec, entry: Entry, error: Any) -> bool:
        """Under the lock: an SPMD member's collective says a peer is gone, maybe before fray has learnt of that
        peer's death: the error waits for it (up to LOST_PEER_GRACE), so the call fails with the group's death,
        naming the rank that died. True if the entry is held (or failed with that death already)."""
        group = rec.group
        if group is None or not group.distributed or not lost_peer(error):
            return False
        if group.error is not None:  # it failed already (dead, or restarting)
            self.directory.complete(entry, None, type(group.error)(str(group.error)))
            return True
        group.held[entry.id] = entry

        def release() -> None:  # no death came: the collective's own error it is
            with self.lock:
                if group.held.pop(entry.id, None) is not None:
                    self.directory.complete(entry, None, error)

        runtime.call_later(LOST_PEER_GRACE, release)
        return True

    def watch(self, entry: Entry) -> None:
        """Under the lock: the entry of a call completes by itself when its reply comes (somebody waits on it)."""
        runtime.on_done(entry.future, partial(self.reply, entry))

    def resolve(self, entry: Entry, timeout: float | None) -> bool:
        """Wait for entry (not under the lock); False if `timeout` passed first. A reply not read yet is read
        directly from its Monarch future for up to FIRST_READ (the fast path of an actor round trip)."""
        fut = entry.future
        if fut is not None and not entry.outcome.done():
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                reply = fut.get(timeout=FIRST_READ if timeout is None else min(timeout, FIRST_READ))
            except TimeoutError:  # from now on its reply, or fray's sight of its process's death, completes it
                self.directory.awaited([entry])
            except Exception as exc:
                self.reply(entry, None, exc)
            else:
                self.reply(entry, reply, None)
            if entry.outcome.done():
                return True
            # (held: an SPMD member's lost-peer error waiting for the peer's death; see hold)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        return entry.outcome.wait(timeout)

    # ------------------------------------------------------------ creation and placement
    def name_taken(self, name: str | None) -> bool:
        """Under the lock: a live actor has this name."""
        existing = self.names.get(name) if name is not None else None
        return existing is not None and self.by_id[existing].state != ActorState.DEAD

    def add(self, rec: ActorRec) -> None:
        """Under the lock."""
        self.by_id[rec.id] = rec
        if rec.name is not None:
            self.names[rec.name] = rec.id

    def create(
        self,
        cls_data: bytes,
        class_name: str,
        methods: frozenset[str],
        args: WireValue,
        deps: list[str],
        keep: list[Any],
        request: ActorRequest,
        member: Member | None = None,
    ) -> ActorDesc:
        options = request.options
        with self.lock:
            if options.name is not None and self.name_taken(options.name):
                if options.get_if_exists:
                    return self.by_id[self.names[options.name]].desc
                raise ActorAlreadyExistsError(f"an actor named {options.name!r} exists already")
            resources = request.resource_dict()
            if not self.holds.free_for(resources.get("GPU", 0.0)):
                raise self.holds.refuse(f"actor {class_name}", resources["GPU"])
            rec = ActorRec(
                self.ids.actor(),
                options.name,
                class_name,
                methods,
                cls_data,
                args,
                deps,
                keep,
                options,
                resources,
                info=member.info if member is not None else ActorInfo(name=options.name),
                env=dict(member.env) if member is not None else {},
                dedicated=member is not None and member.distributed,
            )
            self.add(rec)
            self.place(rec)
            return rec.desc

    def place(self, rec: ActorRec, on_init: Callable[[Any, BaseException | None], None] = ignore) -> None:
        """Under the lock: spawn the actor on the least loaded live process that can hold its resources, or on a
        fresh process of its own (a dedicated actor: an SPMD member; a group member coming back). on_init is
        told when its __init__ has returned (an SPMD group's restart waits for every rank's)."""
        previous, amount = rec.gpus, rec.resources.get("GPU", 0.0)
        member = rec.dedicated and rec.group is not None  # (a group member keeps the devices its env names)
        if not member:
            self.holds.give_back_gpus(rec)  # (a restart holds its devices afresh)
        if amount and rec.group is None:
            placed = self.holds.for_actor(amount, rec.id, rec.resources.get("CPU"))
            if placed is None:
                raise self.holds.refuse(f"actor {rec.label}", amount)
            proc, rec.gpus, own = placed
            if own:
                self.holds.claim_on_host(rec, proc.host)
            else:
                self.holds.claim(rec, proc)
        elif rec.dedicated:  # (a group member coming back: on a fresh process, never on its group's mesh)
            if previous and not member:
                rec.gpus = self.holds.again(rec.host, amount, previous)
            proc = self.pool.spawn(rec.host, dedicated=rec.id, cpus=rec.resources.get("CPU"), member=True)
            rec.slot = None
            self.holds.claim_on_host(rec, rec.host)
        else:
            pool = self.pool.general()
            candidates = [p for p in pool if p.fits_at_all(local_part(rec.resources))] or pool
            proc = min(candidates, key=lambda p: (len(p.actors), len(p.outstanding)))
            self.holds.claim(rec, proc)
        rec.proc = proc
        proc.actors.add(rec.id)
        env = {**rec.env, ENV_HELD: ",".join(map(str, rec.gpus))} if rec.gpus else rec.env
        rec.mesh = proc.mesh.spawn(
            f"fray_actor_{rec.id}_{rec.restarts}",
            FrayActorHost,
            self.pool.setup(proc.host, proc.key, proc.capacity),
            rec.options.max_concurrency,
            rec.dedicated,
        )
        init = rec.mesh.init.call_one(rec.cls_data, rec.args, rec.deps, [(rec.info, env)])
        runtime.on_done(init, on_init)

    # ------------------------------------------------------------ death
    def dead(self, rec: ActorRec, reason: str) -> None:
        """Under the lock: the actor is dead for good (killed, crashed with no restart left)."""
        rec.state, rec.reason = ActorState.DEAD, reason
        RECORDER.record(Kind.ACTOR_DIED, rec.id, rec.class_name, {"reason": reason})
        if rec.name is not None and self.names.get(rec.name) == rec.id:
            del self.names[rec.name]
        proc = rec.proc
        if proc is not None:
            proc.actors.discard(rec.id)
        self.holds.unclaim(rec)
        rec.keep = []
        self.fail_inflight(rec, RuntimeError(reason))
        for held in rec.waiting:
            self.directory.complete(held.entry, None, ActorDiedError(f"actor {rec.label} died: {reason}"))
        rec.waiting = []
        self.resources_freed()

    def proc_died(self, proc: Proc, reason: str) -> None:
        """Under the lock: the actors of a dead process come back on another (restarts left) or are dead."""
        for aid in list(proc.actors):
            rec = self.by_id[aid]
            if rec.state == ActorState.DEAD:
                continue  # (its SPMD group died with another member, just now)
            fail_after_grace(rec, reason, self.directory.awaited, self.reply, self.streams.actor_failed)
            if rec.group is not None and rec.group.distributed and self.gang_died is not None:
                self.gang_died(rec, f"its process crashed: {reason}", True)  # the whole group fails with it
            elif rec.can_restart:
                rec.restarts += 1
                RECORDER.record(
                    Kind.ACTOR_RESTART, rec.id, rec.class_name, {"reason": f"its process crashed: {reason}"}
                )
                try:
                    self.place(rec)
                except InfeasibleResourcesError as refused:  # its GPUs were taken by other work meanwhile
                    self.dead(rec, f"its process crashed ({reason}) and it could not restart: {refused}")
                    continue
                self.fail_inflight(rec, RuntimeError(reason))  # -> ActorUnavailableError
                waiting, rec.waiting = rec.waiting, []
                for held in waiting:  # (calls made after the death, before this news: to its new life now)
                    held.entry.actor_restarts = rec.restarts
                    self.send_one(*held)
                self.directory.awaited([held.entry for held in waiting])  # (their getters may wait already)
            else:
                self.dead(rec, f"its process crashed: {reason}")

    def track(self, rec: ActorRec, entry: Entry) -> None:
        """Under the lock: a call sent to rec by group broadcast (answered on the reply port, group_answer)."""
        rec.inflight.add(entry.id)
        self.inflight[entry.id] = entry

    def answered(self, oid: str) -> Entry | None:
        """Under the lock: the entry of a broadcast call now answered; None if it failed already."""
        entry = self.inflight.pop(oid, None)
        if entry is not None and entry.actor is not None:
            entry.actor.inflight.discard(oid)
        return entry

    def fail_inflight(self, rec: ActorRec, exc: BaseException) -> None:
        """Under the lock: its calls sent by group broadcast will not be answered (it died, or is restarting)."""
        for oid in list(rec.inflight):
            entry = self.inflight.pop(oid, None)
            if entry is not None:
                self.reply(entry, None, exc)
        rec.inflight.clear()

    # ------------------------------------------------------------ calls
    def get(self, aid: str) -> ActorRec:
        rec = self.by_id.get(aid)
        if rec is None:
            raise ActorDiedError(f"unknown actor {aid}")
        return rec

    def call(
        self,
        aid: str,
        method: str,
        args: WireValue,
        deps: list[str],
        keep: list[Any],
        proc_key: str | None = None,
    ) -> RefPayload:
        with self.lock:
            rec = self.get(aid)
            entry, payload = self.directory.new(self.ids.object())
            entry.actor = rec
            entry.actor_restarts = rec.restarts
            if proc_key is not None:
                entry.remote[proc_key] = 1
            if rec.state == ActorState.DEAD:
                error = ActorDiedError(f"actor {rec.class_name} {aid} is dead: {rec.reason}")
                self.directory.complete(entry, None, error)
                return payload
            entry.keep = keep
            group = rec.group
            if group is not None and group.distributed:  # its SPMD group restarts, or is about to (the call waits)
                if group.wait_for_restart(rec, entry, method, args, deps):
                    return payload
                if group.error is not None:  # dead
                    self.directory.complete(entry, None, type(group.error)(str(group.error)))
                    return payload
            elif rec.wait_for_restart(entry, method, args, deps):
                return payload
            self.send_one(rec, entry, method, args, deps)
            return payload

    def call_plain(self, aid: str, method: str, data: bytes) -> RefPayload:
        """A call whose arguments are small and plain (`data`, their pickle: no refs, no buffers), to a live actor
        outside any group: the usual call of an actor round trip, in as few steps as it can take. Every step of
        fray's own here costs several times its warm-cache time, because it runs right after the wait for the
        previous reply (with the caches cold). Any other call goes through call()."""
        with self.lock:
            rec = self.by_id.get(aid)
            if rec is None or rec.state is ActorState.DEAD or rec.group is not None or rec.died_unseen:
                return self.call(aid, method, WireValue(Inline(data)), [], [])
            entry, payload = self.directory.new(self.ids.object())
            entry.actor = rec
            entry.actor_restarts = rec.restarts
            entry.future = rec.mesh.call.call_one((entry.id, method, data))  # (a PlainCall: see workers/hosts.py)
            entry.watch = self._watch
            rec.calls[entry.id] = entry
            return payload

    def send_one(self, rec: ActorRec, entry: Entry, method: str, args: WireValue, deps: list[str]) -> None:
        """Under the lock: a call to rec alone. An SPMD member's reply is watched at once and the call is listed
        in its group, whose death fails it (the future of a call on a mesh fray stopped may never complete)."""
        message = plain_call(entry.id, method, args, deps)
        fut = rec.mesh.call.call_one(message or compact(ActorCall(entry.id, method, args, deps), args.value))
        group = rec.group
        if group is None or not group.distributed:
            entry.future = fut
            entry.watch = self._watch
            rec.calls[entry.id] = entry
            return
        group.calls[entry.id] = entry

        def replied(value: Any, exc: BaseException | None) -> None:
            with self.lock:
                group.calls.pop(entry.id, None)
                self.reply(entry, value, exc)

        runtime.on_done(fut, replied)

    def call_stream(self, aid: str, method: str, args: Any, deps: list[str], keep: list[Any]) -> str:
        """A generator method's call: its items come as a stream (streaming.py); returns the stream's id."""
        with self.lock:
            actor = self.get(aid)
        return self.streams.call_actor(actor, method, args, deps, keep)

    def info(self, name: str) -> ActorDesc:
        with self.lock:
            aid = self.names.get(name)
            if aid is None or self.by_id[aid].state == ActorState.DEAD:
                raise ActorNotFoundError(f"no live actor named {name!r}")
            return self.by_id[aid].desc

    def kill(self, aid: str) -> None:
        with self.lock:
            rec = self.get(aid)
            if rec.state == ActorState.DEAD:
                return
            self.dead(rec, "it was killed")
            if rec.group is not None and rec.group.distributed and self.gang_died is not None:
                self.gang_died(rec, "it was killed", False)  # (its peers' collectives need it: the group goes too)
            mesh = rec.mesh
            own = rec.proc if rec.dedicated else None
            in_group_mesh = rec.slot is not None
            if own is not None and self.pool.forget(own):  # its whole process goes with it, and what it stored
                self.directory.forget_holder(own.key)
                self.directory.mark_lost(own.key, f"it was stored by actor {rec.label}, which was killed")
        try:
            if in_group_mesh and own is not None:  # one process of its group's mesh (a slice cannot be stopped)
                own.worker.exit_process.broadcast()
            else:
                runtime.on_done((own.mesh if own is not None else mesh).stop(), ignore)
        except Exception:
            pass
