"""Actors, a part of the Controller: the registry of fray actors (names, restarts, death), each a Monarch
actor on a worker process, and the replies of their calls.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fray.current import ActorInfo
from fray.errors import (
    ActorAlreadyExistsError,
    ActorDiedError,
    ActorNotFoundError,
    ActorUnavailableError,
)
from fray.groups import Member
from fray.refs import public_methods
from fray.resources import add, subtract
from fray.serialization import Blob, loads
from fray.states import ActorState
from fray.types import ActorOptions, normalize_resources
from fray_monarch import _runtime
from fray_monarch.actors import FrayActorHost
from fray_monarch.directory import Entry, ObjectDirectory
from fray_monarch.objects import RefPayload
from fray_monarch.protocol import ActorReply, WireValue, WorkerSetup
from fray_monarch.scheduler import Proc


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
    proc: Proc | None = None  # the process it runs in
    mesh: Any = None
    restarts: int = 0
    state: ActorState = ActorState.ALIVE
    reason: str = ""
    info: ActorInfo = field(default_factory=ActorInfo)  # what fray.current_actor() says inside it
    env: dict[str, str] = field(default_factory=dict)  # set in its process's os.environ before __init__
    dedicated: bool = False  # it owns its process (an SPMD member, a member of a group's own mesh)
    host: int = 0  # the fray host of its own process (dedicated)
    claim: Proc | None = None  # the process whose share of the host its resources are taken from
    group: Any = None  # the GroupRec of a group member (meshgroups.py)
    slot: tuple[int, int] | None = None  # (block, flat index) in its group's mesh; None once on a process of its own
    inflight: set[str] = field(default_factory=set)  # its calls sent by group broadcast, not answered yet

    @property
    def can_restart(self) -> bool:
        return self.options.max_restarts == -1 or self.restarts < self.options.max_restarts

    @property
    def label(self) -> str:
        """How errors name it: class, name (a group member's is "group/rank") and rank in its group."""
        who = f"{self.class_name} {self.name!r}" if self.name else f"{self.class_name} {self.id}"
        if self.info.group is not None or self.info.size > 1:
            who += f" (rank {self.info.rank} of {self.info.size})"
        return who


class ActorRegistry:
    """The actor half of the Controller (mixed into it; its state is set by Controller.__init__)."""

    lock: threading.RLock
    objects: ObjectDirectory
    procs: list[Proc]
    actors: dict[str, ActorRec]
    names: dict[str, str]
    inflight: dict[str, Entry]  # group-broadcast calls not answered yet, by object id

    if TYPE_CHECKING:  # provided by the Controller or its other parts

        def new_oid(self) -> str: ...
        def _worker_setup(self, host: int, proc_key: str) -> WorkerSetup: ...
        def _pump(self) -> None: ...

    def _resolve_reply(self, entry: Entry, reply: ActorReply | None, exc: BaseException | None) -> None:
        with self.lock:
            if entry.outcome.done():
                return
            rec = entry.actor
            if exc is not None or reply is None:
                # The process died during the call. Restarting (or restarted already: the death may have been
                # handled first, counting the restart) -> unavailable; no restart left -> dead.
                restarted = rec is not None and rec.restarts > entry.actor_restarts
                if rec is not None and not restarted and (rec.state == ActorState.DEAD or not rec.can_restart):
                    why = rec.reason or "its process crashed"
                    self.objects.complete(entry, None, ActorDiedError(f"actor {rec.label} died: {why}"))
                else:
                    name = rec.label if rec else "?"
                    self.objects.complete(
                        entry,
                        None,
                        ActorUnavailableError(f"actor {name}: its process crashed during this call; it is restarting"),
                    )
            elif reply.status == "ok" and reply.value is not None:
                self.objects.complete(entry, reply.value.value, None, reply.value.contained)
            elif reply.status == "dead":
                name = rec.label if rec else ""
                self.objects.complete(entry, None, ActorDiedError(f"actor {name} is dead: {reply.reason}"))
            else:
                self.objects.complete(entry, None, reply.error)

    def create_actor(
        self,
        cls_data: bytes,
        class_name: str,
        methods: frozenset[str],
        args: WireValue,
        deps: list[str],
        keep: list[Any],
        options: ActorOptions,
        member: Member | None = None,
    ) -> tuple[str, str, frozenset[str], str | None]:
        with self.lock:
            if options.name is not None:
                existing = self.names.get(options.name)
                if existing is not None and self.actors[existing].state != ActorState.DEAD:
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
                info=member.info if member is not None else ActorInfo(name=options.name),
                env=dict(member.env) if member is not None else {},
                dedicated=member is not None and member.distributed,
            )
            self.actors[aid] = rec
            if options.name is not None:
                self.names[options.name] = aid
            self._place_actor(rec)
            return aid, class_name, methods, options.name

    def create_actor_remote(
        self,
        proc_key: str,
        cls_data: bytes,
        args: WireValue,
        deps: list[str],
        options: ActorOptions,
        member: Member | None = None,
    ) -> tuple[str, str, frozenset[str], str | None]:
        klass = loads(Blob(cls_data))
        keep = [RefPayload(i) for i in (*args.contained, *deps)]
        return self.create_actor(cls_data, klass.__name__, public_methods(klass), args, deps, keep, options, member)

    def _general_procs(self, host: int | None = None) -> list[Proc]:
        return [p for p in self.procs if p.alive and p.general and (host is None or p.host == host)]

    def _claim(self, rec: ActorRec, proc: Proc) -> None:
        """Under the lock: rec's resources are taken from proc's share of its host (tasks there see less room)."""
        rec.claim = proc
        if rec.resources:
            add(proc.claims, rec.resources)
            proc.worker.set_capacity.broadcast(proc.free_capacity)

    def _unclaim(self, rec: ActorRec) -> None:
        proc, rec.claim = rec.claim, None
        if proc is not None and rec.resources:
            subtract(proc.claims, rec.resources)
            if proc.alive:
                proc.worker.set_capacity.broadcast(proc.free_capacity)

    def _claim_on_host(self, rec: ActorRec, host: int) -> None:
        """Under the lock: claim an actor's resources from the general process of `host` with the most room for
        them (an actor with its own process still counts against its host's CPUs)."""
        if rec.claim is not None and rec.claim.alive:
            return
        pool = self._general_procs(host) or self._general_procs()
        if not pool:
            return
        fitting = [p for p in pool if p.fits_at_all(rec.resources)] or pool
        self._claim(rec, max(fitting, key=lambda p: (p.free_capacity.get("CPU", 0.0), -len(p.actors))))

    def _place_actor(self, rec: ActorRec) -> None:
        """Under the lock: spawn the actor on the least loaded live process that can hold its resources, or on a
        fresh process of its own (a dedicated actor: an SPMD member; a group member coming back)."""
        if rec.dedicated:  # (a group member coming back: on a fresh process, never on its group's mesh)
            proc = self._spawn_proc(rec.host, dedicated=rec.id)
            rec.slot = None
            self._claim_on_host(rec, rec.host)
        else:
            pool = self._general_procs()
            candidates = [p for p in pool if p.fits_at_all(rec.resources)] or pool
            proc = min(candidates, key=lambda p: (len(p.actors), len(p.outstanding)))
            self._claim(rec, proc)
        rec.proc = proc
        proc.actors.add(rec.id)
        rec.mesh = proc.mesh.spawn(
            f"fray_actor_{rec.id}_{rec.restarts}",
            FrayActorHost,
            self._worker_setup(proc.host, proc.key, proc.capacity),
            rec.options.max_concurrency,
            rec.dedicated,
        )
        init = rec.mesh.init.call_one(rec.cls_data, rec.args, rec.deps, [(rec.info, rec.env)])
        _runtime.on_done(init, lambda _v, _e: None)

    def _actor_dead(self, rec: ActorRec, reason: str) -> None:
        rec.state, rec.reason = ActorState.DEAD, reason
        if rec.name is not None and self.names.get(rec.name) == rec.id:
            del self.names[rec.name]
        proc = rec.proc
        if proc is not None:
            proc.actors.discard(rec.id)
        self._unclaim(rec)
        rec.keep = []
        self._fail_inflight(rec, RuntimeError(reason))
        self._pump()

    def _fail_inflight(self, rec: ActorRec, exc: BaseException) -> None:
        """Under the lock: its calls sent by group broadcast will not be answered (it died, or is restarting)."""
        for oid in list(rec.inflight):
            entry = self.inflight.pop(oid, None)
            if entry is not None:
                self._resolve_reply(entry, None, exc)
        rec.inflight.clear()

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
            entry.actor_restarts = rec.restarts
            if proc_key is not None:
                entry.remote[proc_key] = 1
            if rec.state == ActorState.DEAD:
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
            if aid is None or self.actors[aid].state == ActorState.DEAD:
                raise ActorNotFoundError(f"no live actor named {name!r}")
            rec = self.actors[aid]
            return rec.id, rec.class_name, rec.methods, rec.name

    def kill_actor(self, aid: str) -> None:
        with self.lock:
            rec = self.actor(aid)
            if rec.state == ActorState.DEAD:
                return
            self._actor_dead(rec, "it was killed")
            mesh = rec.mesh
            own = rec.proc if rec.dedicated else None
            in_group_mesh = rec.slot is not None
            if own is not None and own.alive:  # its whole process goes with it, and what that process stored
                own.alive = False
                if own in self.procs:
                    self.procs.remove(own)
                self.objects.forget_holder(own.key)
                self.objects.mark_lost(own.key, f"it was stored by actor {rec.label}, which was killed")
        try:
            if in_group_mesh and own is not None:  # one process of its group's mesh (a slice cannot be stopped)
                own.worker.exit_process.broadcast()
            else:
                _runtime.on_done((own.mesh if own is not None else mesh).stop(), lambda _v, _e: None)
        except Exception:
            pass
