"""Actor groups, a part of the Controller: a group is one Monarch actor mesh over a process mesh of its own (a
process per member), and a call to the whole group is one Monarch broadcast.

Placement over fray hosts: "pack" fills the host with the most room first; "spread" shares the members out over
the hosts as evenly as it can. Members on one host, or spread evenly over a contiguous range of attached hosts,
are ONE mesh (hosts x procs); an uneven spread is one mesh per host ("block"), and a group call is then one
broadcast per block. Each member answers a broadcast on the controller's reply port with its own object id, so
its result is available as soon as it is done, and a member that dies fails only its own refs.

Per-member sends (call_one to the member's slice of the mesh) serve: a call through one handle (`group[i].m()`),
and every call to a member that was restarted after a crash: it comes back on a fresh process of its own, never
on its group's mesh, which lost a process (Monarch hangs spawning on such a mesh). A group call to a slice
(`group[2:5]`), or to a group with dead or restarted members, is one broadcast per contiguous run of live
members still on the mesh (Monarch slices only ranges).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from monarch.actor import Channel

from fray.backend import (
    ActorInfo,
    ActorRequest,
    ActorState,
    GroupRequest,
    add,
    capacity,
    free_port,
    group_label,
    hang_timeout,
    member_name,
    spmd_env,
    worker_env_defaults,
)
from fray.errors import ActorAlreadyExistsError, ActorDiedError, FrayError, InfeasibleResourcesError
from fray_monarch.core import runtime
from fray_monarch.core.actor_classes import actor_host, worker_host
from fray_monarch.core.objects import RefPayload
from fray_monarch.core.protocol import ActorReply, ReplyStatus, WireValue, compact, plain_data, read_group_answer
from fray_monarch.driver.actor_rec import ActorRec
from fray_monarch.driver.actor_registry import ActorRegistry
from fray_monarch.driver.directory import ObjectDirectory
from fray_monarch.driver.group_rec import Block, GroupRec
from fray_monarch.driver.ids import Ids
from fray_monarch.driver.proc_rec import Proc, local_part
from fray_monarch.driver.processes import ProcessPool, ignore

FrayActorHost = actor_host()  # fray_monarch.workers.hosts.FrayActorHost, by name (core/actor_classes.py)
WorkerHost = worker_host()  # fray_monarch.workers.hosts.WorkerHost, by name (core/actor_classes.py)


class GroupRegistry:
    """The actor groups of one context, under the controller's lock; their members are actors of `actors`."""

    def __init__(
        self, lock: threading.RLock, ids: Ids, directory: ObjectDirectory, pool: ProcessPool, actors: ActorRegistry
    ) -> None:
        self.lock = lock
        self.ids = ids
        self.directory = directory
        self.pool = pool
        self.actors = actors
        self.by_id: dict[str, GroupRec] = {}
        self.reply_port, self.reply_receiver = Channel.open()  # where members answer broadcasts
        self.reply_thread: threading.Thread | None = None
        self.spmd_created: Callable[[GroupRec], None] | None = None  # (gangs.py watches SPMD groups for hangs)

    # ------------------------------------------------------------ placement
    def _host_room(self, host: int, resources: dict[str, float]) -> float:
        """How many members asking `resources` the free share of `host` and its free GPUs (held per host, by
        device: not in a process's share) still hold (inf when they ask none)."""
        local = local_part(resources)
        gpus = self.pool.devices[host].room(resources.get("GPU", 0.0))
        if not any(q > 0 for q in local.values()):
            return gpus
        free: dict[str, float] = {}
        for proc in self.pool.general(host):
            add(free, proc.free_capacity)
        return min(float(capacity(free, local)), gpus)

    def _layout(
        self, count: int, placement: str, resources: dict[str, float], among: list[int] | None = None
    ) -> list[tuple[int, int]]:
        """(host, members) in host order, over the hosts `among` (default: all): pack fills the roomiest host
        first; spread shares out evenly. Best effort: what does not fit goes to the roomiest host (the core
        refused what could never fit)."""
        hosts = range(len(self.pool.hosts)) if among is None else among
        room = {h: self._host_room(h, resources) for h in hosts}
        order = sorted(hosts, key=lambda h: -room[h])  # stable: the first host wins a tie
        share: dict[int, int] = {}
        if placement == "spread":
            chosen = order[: min(count, len(order))]
            base, extra = divmod(count, len(chosen))
            share = {h: base + (1 if i < extra else 0) for i, h in enumerate(chosen)}
        else:
            left = count
            for h in order:
                take = left if room[h] == math.inf else min(left, max(0, int(room[h])))
                if take:
                    share[h] = take
                    left -= take
                if not left:
                    break
            if left:
                share[order[0]] = share.get(order[0], 0) + left
        return sorted((h, n) for h, n in share.items() if n > 0)

    def relayout(self, group: GroupRec) -> bool:
        """Under the lock, in a restart: the members of an SPMD group placed again over the hosts that are not
        lost, by the group's placement, with their LOCAL_RANK and LOCAL_WORLD_SIZE (MASTER_ADDR and MASTER_PORT
        are the restart's) and their GPUs: held afresh on their hosts (a member staying on its host keeps its
        devices where it can), each seeing its host's members' devices in rank order again, as when the group was
        made. False if those hosts cannot hold every member."""
        live = self.pool.live_hosts()
        count = len(group.members)
        resources = group.members[0].resources
        amount = resources.get("GPU", 0.0)
        previous = [(m.host, m.gpus) for m in group.members]
        for member in group.members:  # (held on the host each was on, lost or not; held again below, or it dies)
            self.actors.holds.give_back(member.host, member.gpus, amount)
            member.gpus = ()
        if not live or sum(self._host_room(h, resources) for h in live) < count:
            return False
        layout = self._layout(count, group.placement, resources, live)
        hosts = self._hosts_of(layout)
        envs = [spmd_env(rank, count, "", 0, local, n) for rank, (local, n) in enumerate(self._locals(layout))]
        kept = [gpus if was == host else () for (was, gpus), host in zip(previous, hosts, strict=True)]
        try:
            held = self.actors.holds.for_group(hosts, amount, envs, group.label, prefer=kept)
        except InfeasibleResourcesError:
            return False
        for member, host, env, devices in zip(group.members, hosts, envs, held, strict=True):
            member.host, member.gpus = host, devices
            member.env = {**member.env, **env}
        return True

    @staticmethod
    def _locals(layout: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Each rank's (LOCAL_RANK, LOCAL_WORLD_SIZE), in rank order."""
        return [(local, n) for _, n in layout for local in range(n)]

    @staticmethod
    def _hosts_of(layout: list[tuple[int, int]]) -> list[int]:
        """Each rank's host, in rank order."""
        return [host for host, n in layout for _ in range(n)]

    def _blocks(self, layout: list[tuple[int, int]]) -> list[tuple[list[int], int, bool]]:
        """(hosts, members per host, 2-D) of each process mesh: one mesh when all members are on one host, or
        evenly on a contiguous range of attached hosts; else one per host."""
        hosts = [h for h, _ in layout]
        even = len({n for _, n in layout}) == 1
        contiguous = hosts == list(range(hosts[0], hosts[0] + len(hosts)))
        if len(layout) > 1 and even and contiguous and self.pool.host_mesh is not None:
            return [(hosts, layout[0][1], True)]
        return [([h], n, False) for h, n in layout]

    def master_address(self, host: int, loopback: bool = False) -> tuple[str, int]:
        """The address of `host` (rank 0's; 127.0.0.1 if `loopback`: every member is on that host) and a TCP port
        free there now, asked of a process there unless it is this machine's. Rank 0 serves the rendezvous store
        on that address alone (fray.runtime.rendezvous)."""
        bind = "127.0.0.1" if loopback else self.pool.stores.bind_hosts[host]
        if self.pool.stores.host_ids[host] == "local":
            return bind, free_port(bind)
        with self.lock:
            pool = self.pool.general(host)
        if not pool:
            raise FrayError(f"no live worker process on host {host} to place an SPMD group's rank 0 on")
        address, port = pool[0].worker.spmd_master.call_one(loopback).get(timeout=60)
        return str(address), int(port)

    # ------------------------------------------------------------ creation
    def create(
        self,
        cls_data: bytes,
        class_name: str,
        methods: frozenset[str],
        args: WireValue,
        deps: list[str],
        keep: list[Any],
        request: GroupRequest,
    ) -> tuple[str, list[tuple[str, str | None]]]:
        """Spawn the group's process mesh(es) and its members on them; returns its id and each member's (actor
        id, name), by rank. All or nothing: if a mesh cannot be spawned, what was made is stopped."""
        options, count, placement, distributed = (
            request.member.options,
            request.count,
            request.placement,
            request.distributed,
        )
        resources = request.member.resource_dict()
        self.pool.probe_doubted()
        with self.lock:
            live = self.pool.live_hosts()
            if not live:
                why = "; ".join(sorted(set(self.pool.lost_hosts.values())))
                raise ActorDiedError(f"group {class_name} of {count} cannot be placed: every host is lost: {why}")
            layout = self._layout(count, placement, resources, live)  # (never on a lost host)
        envs: list[dict[str, str]] = [{} for _ in range(count)]
        if distributed:  # torch.distributed's variables: rank 0's host is the master; LOCAL_RANK per host
            master = layout[0][0]
            addr, port = self.master_address(master, loopback=len(layout) == 1)
            rank = 0
            for _host, n in layout:
                for local in range(n):
                    envs[rank] = spmd_env(rank, count, addr, port, local, n)
                    rank += 1
        with self.lock:
            if self.pool.closed:
                raise FrayError("the fray-monarch context is shut down")
            names = [member_name(options.name, rank) for rank in range(count)]
            for name in names:
                if self.actors.name_taken(name):
                    raise ActorAlreadyExistsError(f"an actor named {name!r} exists already")
            held = self.actors.holds.for_group(self._hosts_of(layout), resources.get("GPU", 0.0), envs, class_name)
            label = group_label(class_name, count, options.name)
            group = GroupRec(self.ids.group(), options.name, label=label, distributed=distributed, placement=placement)
            group.max_restarts = options.max_restarts if distributed else 0
            group.hang_timeout = hang_timeout() if distributed else math.inf
            try:
                for hosts, per_host, two_d in self._blocks(layout):
                    actor = (cls_data, class_name, methods, args, deps, keep, request.member)
                    self._spawn_block(group, hosts, per_host, two_d, names, envs, actor)
            except BaseException:
                made = len(group.members)
                for member, devices in zip(group.members, held, strict=False):
                    member.gpus = devices  # (given back as drop kills them)
                self.drop(group, "its group could not be created")
                for host, devices in list(zip(self._hosts_of(layout), held, strict=True))[made:]:
                    self.actors.holds.give_back(host, devices, resources.get("GPU", 0.0))
                raise
            for member, devices in zip(group.members, held, strict=True):
                member.gpus = devices
            self.by_id[group.id] = group
            if distributed and self.spmd_created is not None:
                self.spmd_created(group)
            if self.reply_thread is None:  # the first group: answers are read from now on
                self.reply_thread = runtime.receive_each(self.reply_receiver, self._answer, "fray-monarch-replies")
            return group.id, [(m.id, m.name) for m in group.members]

    def _spawn_block(
        self,
        group: GroupRec,
        hosts: list[int],
        per_host: int,
        two_d: bool,
        names: list[str | None],
        envs: list[dict[str, str]],
        actor: tuple[bytes, str, frozenset[str], WireValue, list[str], list[Any], ActorRequest],
    ) -> None:
        """Under the lock: one process mesh of the group, its members on it, their init broadcast."""
        cls_data, class_name, methods, args, deps, keep, each = actor
        options = each.options
        count = len(names)
        size = len(hosts) * per_host
        pool = self.pool
        where = pool.host_mesh.slice(hosts=slice(hosts[0], hosts[-1] + 1)) if two_d else pool.hosts[hosts[0]]
        resources = each.resource_dict()
        boot = pool.boot(worker_env_defaults(resources.get("CPU")))
        procs = where.spawn_procs(
            per_host={"procs": per_host}, name=f"fray_{self.ids.key}_{group.id}_{len(group.blocks)}", **boot
        )
        keys = [self.ids.proc() for _ in range(size)]
        host_of = [hosts[i // per_host] for i in range(size)]
        setups = [pool.setup(host_of[i], keys[i], {}) for i in range(size)]
        workers = procs.spawn("fray_worker", WorkerHost, setups, {}, resources.get("CPU"))
        actors = procs.spawn(f"fray_group_{group.id}", FrayActorHost, setups, options.max_concurrency, True)
        block = Block(procs, actors, workers, hosts, per_host, two_d, len(group.members), size)
        group.blocks.append(block)
        members: list[tuple[ActorInfo, dict[str, str]]] = []
        for index in range(size):
            rank = len(group.members)
            aid = self.ids.actor()
            info = ActorInfo(names[rank], rank, count, group.name)
            rec = ActorRec(
                aid,
                names[rank],
                class_name,
                methods,
                cls_data,
                args,
                deps,
                keep,
                options,
                resources,
                info=info,
                env=envs[rank],
                dedicated=True,
                host=host_of[index],
                group=group,
                slot=(len(group.blocks) - 1, index),
            )
            proc = Proc(keys[index], host_of[index], procs, block.member(workers, index), {}, dedicated=aid)
            pool.adopt(proc)
            rec.proc = proc
            proc.actors.add(aid)
            rec.mesh = block.member(actors, index)
            self.actors.add(rec)
            self.actors.holds.claim_on_host(rec, rec.host)
            group.members.append(rec)
            members.append((info, envs[rank]))
        group.inits.append(runtime.on_done(actors.init.call(cls_data, args, deps, members, self.reply_port), ignore))

    def drop(self, group: GroupRec, reason: str) -> list[Any]:
        """Under the lock: every member dead, their processes forgotten; returns the meshes to stop."""
        meshes = [block.procs for block in group.blocks]
        group.dead = True  # (an SPMD group's restart under way stops here: gangs.py checks it)
        group.generation += 1
        waiting, group.waiting = group.waiting, []
        for held in waiting:  # (calls made while it restarted)
            if not held.entry.outcome.done():
                self.directory.complete(held.entry, None, ActorDiedError(f"{group.label} is dead: {reason}"))
        for rec in group.members:
            if rec.state != ActorState.DEAD:
                self.actors.dead(rec, reason)
            proc = rec.proc
            if proc is not None and self.pool.forget(proc):
                self.directory.forget_holder(proc.key)
                self.directory.mark_lost(proc.key, f"it was stored by actor {rec.label}, which was killed")
                if rec.slot is None:  # restarted on a process of its own
                    meshes.append(proc.mesh)
        self.by_id.pop(group.id, None)
        return meshes

    # ------------------------------------------------------------ calls
    def call(
        self,
        aids: list[str],
        method: str,
        args: WireValue,
        deps: list[str],
        keep: list[Any],
        proc_key: str | None = None,
    ) -> list[RefPayload]:
        """One ref per member, in the order given. Members still on their group's mesh get one broadcast per
        block (per contiguous run, for a slice); the others (restarted ones) a call of their own."""
        out: list[RefPayload] = []
        sends: dict[tuple[str, int], list[int]] = {}
        with self.lock:
            base = self.ids.object()  # a member's answer to the broadcast is object "{base}.{rank}"
            cast: set[str] = set()
            for aid in aids:
                rec = self.actors.get(aid)
                in_mesh = rec.group is not None and rec.slot is not None and rec.proc is not None and rec.proc.alive
                in_mesh = in_mesh and aid not in cast  # (a member listed twice: the second call is its own send)
                cast.add(aid)
                entry, payload = self.directory.new(f"{base}.{rec.info.rank}" if in_mesh else self.ids.object())
                entry.actor = rec
                entry.actor_restarts = rec.restarts
                if proc_key is not None:
                    entry.remote[proc_key] = 1
                out.append(payload)
                if rec.state == ActorState.DEAD:
                    self.actors.reply(entry, ActorReply(ReplyStatus.DEAD, reason=rec.reason), None)
                    continue
                entry.keep = keep
                group = rec.group
                if group is not None and group.distributed:  # an SPMD group restarting, or about to: it waits
                    if group.wait_for_restart(rec, entry, method, args, deps):
                        continue
                    if group.error is not None:
                        self.directory.complete(entry, None, type(group.error)(str(group.error)))
                        continue
                elif rec.wait_for_restart(entry, method, args, deps):  # (a member restarting on its own)
                    continue
                if in_mesh:
                    assert rec.slot is not None
                    sends.setdefault((rec.group.id, rec.slot[0]), []).append(rec.slot[1])
                    self.actors.track(rec, entry)
                else:
                    self.actors.send_one(rec, entry, method, args, deps)
            if sends:
                data = plain_data(args)
                message = None if data is not None else compact(args, args.value)
                for (gid, b), indices in sends.items():
                    for target in self.by_id[gid].blocks[b].targets(sorted(set(indices))):
                        target.call_group.broadcast(base, method, data, message, deps)
        return out

    def _answer(self, message: tuple[str, bytes | None, Any]) -> None:
        """A member's answer to a broadcast (on fray's loop, from the reply port)."""
        if self.pool.closed:
            return
        try:
            oid, reply = read_group_answer(message)
            with self.lock:
                entry = self.actors.answered(oid)
                if entry is not None:  # (else it failed already: its member died; or shut down)
                    self.actors.reply(entry, reply, None)
        except Exception:
            runtime.log.exception("fray: bad group member answer %r", message[:1])

    # ------------------------------------------------------------ kill
    def kill(self, aids: list[str]) -> None:
        """The whole group: its meshes stopped at once. A part of it (a slice): member by member."""
        with self.lock:
            recs = [self.actors.get(aid) for aid in aids]
            group = recs[0].group
            whole = group is not None and {r.id for r in recs} == {m.id for m in group.members}
            meshes = self.drop(group, "it was killed") if whole and group is not None else None
        if meshes is None:
            for aid in aids:
                self.actors.kill(aid)
            return
        for mesh in meshes:
            try:
                runtime.on_done(mesh.stop(), ignore)
            except Exception:
                runtime.log.debug("fray: stop of a group mesh failed", exc_info=True)

    def close(self) -> None:
        """At shutdown (not under the lock): the reader of members' answers ends."""
        if self.reply_thread is not None:
            self.reply_port.send(None)  # ends the reader
            self.reply_thread.join(timeout=2)
