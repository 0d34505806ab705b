"""Actor groups on Ray: the members of one group share one Ray placement group, one bundle per member.

- Bundle: the member's resources (`ActorOptions.resources`). Ray rejects a bundle whose resources are all zero,
  and a fray actor asks for nothing by default, so such a member gets `DEFAULT_BUNDLE` ({"CPU": 0.01}): a
  hundredth of a CPU reserved per member (100 members hold one CPU). The member itself still asks for what its
  options say (0 CPU), which always fits its bundle.
- Strategy: placement "pack" -> PACK, "spread" -> SPREAD; with strict_placement STRICT_PACK / STRICT_SPREAD.
- Fray refuses a gang that no node set could hold (the core's check_group_feasible, from node totals). A
  feasible placement group that Ray still cannot place within `PLACEMENT_TIMEOUT` (resources held by other work)
  is removed and refused with InfeasibleResourcesError naming what is short: Ray itself would wait forever.
- SPMD (distributed=True): after the placement group is placed, its bundle -> node map gives each member's node.
  MASTER_ADDR is rank 0's node address (127.0.0.1 when every member is on that node: rank 0 serves the rendezvous
  store on MASTER_ADDR alone, fray.runtime.rendezvous), MASTER_PORT a port free on that node (picked here if rank 0's
  node is this process's node, else by a 0-CPU probe task pinned to that node), LOCAL_RANK / LOCAL_WORLD_SIZE count the
  members per node in rank order.
- Lifetime: a whole-group kill removes the placement group; a slice kill keeps it (removing it would kill every
  member). Non-detached placement groups are removed at context shutdown; a detached group's is named after the
  group (`pg_name`) and stays until the group is killed, from any driver.

`RayGroups` is a context's side of it (create, call, kill), with the context's actors and cancel tracker.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import (
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from fray.backend import (
    EPS,
    ActorGroup,
    ActorHandle,
    ActorInfo,
    ActorRequest,
    GroupRequest,
    JobContext,
    Lifetime,
    Member,
    ObjectRef,
    find_unserializable_argument,
    format_amount,
    format_resources,
    free_port,
    group_label,
    hang_timeout,
    heartbeat_interval,
    member_name,
    member_request,
    spmd_env,
)
from fray.errors import InfeasibleResourcesError
from fray_ray._actors import RayActors
from fray_ray._args import hold_shares, is_serialization_error, share_args, share_kwargs, unwrap_args, unwrap_kwargs
from fray_ray._cancel import CancelTracker
from fray_ray._gangs import GangWatch, RayGang
from fray_ray._gpus import RENDEZVOUS_ENV
from fray_ray._heartbeats import HEARTBEAT_ENV
from fray_ray._resend import Resender

__all__ = [
    "DEFAULT_BUNDLE",
    "PLACEMENT_TIMEOUT",
    "RayGroup",
    "RayGroups",
    "create_placement_group",
    "members",
    "pg_name",
]

DEFAULT_BUNDLE: dict[str, float] = {"CPU": 0.01}
PLACEMENT_TIMEOUT = 60.0  # seconds Ray gets to place a feasible group before fray gives up and refuses it
_STRATEGIES = {
    ("pack", False): "PACK",
    ("spread", False): "SPREAD",
    ("pack", True): "STRICT_PACK",
    ("spread", True): "STRICT_SPREAD",
}
_PORT_PROBE_TIMEOUT = 120.0  # the probe task may have to start a worker process on that node


@dataclass(frozen=True)
class RayGroup:
    """`ActorGroup.payload` on Ray (shared by the group's slices; pickles with the group)."""

    placement_group: Any  # ray.util.placement_group.PlacementGroup
    size: int
    detached: bool = False


def pg_name(group: str) -> str:
    """The Ray name of a named group's placement group (found again by a later driver to remove it)."""
    return f"fray-group/{group}"


def bundle(request: ActorRequest) -> dict[str, float]:
    """One member's bundle: its resources without zeros, or DEFAULT_BUNDLE when it asks for nothing."""
    wanted = {name: float(qty) for name, qty in request.resources if qty > 0}
    return wanted or dict(DEFAULT_BUNDLE)


def strategy(placement: str, strict: bool) -> str:
    return _STRATEGIES[(placement, strict)]


def _shortfall(per_member: dict[str, float], count: int) -> str:
    """What the cluster lacks right now for count members of per_member, from Ray's available totals."""
    try:
        available = ray.available_resources()  # type: ignore[no-untyped-call]
    except Exception:  # the connection went away: say only what was asked
        available = {}
    short = []
    for name, qty in sorted(per_member.items()):
        need = qty * count
        have = float(available.get(name, 0.0))
        if have + EPS < need:
            short.append(f"{name}: needs {format_amount(name, need)}, {format_amount(name, have)} free")
    return "; ".join(short) if short else f"enough in total ({_fmt(available)}) but not laid out as asked"


def _fmt(resources: Any) -> str:
    return format_resources(dict(resources))  # (Ray's node: labels left out)


def create_placement_group(
    member: ActorRequest, count: int, placement: str, strict: bool, what: str, timeout: float | None = None
) -> Any:
    """A placed Ray placement group with one bundle per member; InfeasibleResourcesError (and no placement group
    left behind) if Ray cannot place it within the timeout."""
    options = member.options
    per_member = bundle(member)
    how = strategy(placement, strict)
    detached = options.lifetime is Lifetime.DETACHED
    pg = placement_group(
        [dict(per_member) for _ in range(count)],
        strategy=how,
        name=pg_name(options.name) if options.name else "",
        lifetime="detached" if detached else None,
    )
    wait = PLACEMENT_TIMEOUT if timeout is None else timeout
    try:
        placed = pg.wait(max(1, math.ceil(wait)))
    except BaseException:
        remove_placement_group(pg)
        raise
    if not placed:
        remove_placement_group(pg)
        raise InfeasibleResourcesError(
            f"{what}: Ray could not place {count} members x {per_member} with strategy {how} within {wait:g} s "
            f"(missing now: {_shortfall(per_member, count)}). Other tasks or actors may hold those resources; "
            "free them, lower the request, or use placement='spread' / strict_placement=False."
        )
    return pg


def _probe_free_port(host: str) -> int:
    return free_port(host)


_probe: Any = None


def _free_port_on(node_id: str, host: str) -> int:
    """A TCP port free now on the node (this process's node: checked here; another: by a pinned 0-CPU task)."""
    if node_id == ray.get_runtime_context().get_node_id():
        try:
            return free_port(host)
        except OSError:  # host is not an address of this machine after all
            pass
    global _probe
    if _probe is None:
        _probe = ray.remote(num_cpus=0, max_retries=3)(_probe_free_port)
    strategy_ = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return int(ray.get(_probe.options(scheduling_strategy=strategy_).remote(host), timeout=_PORT_PROBE_TIMEOUT))


def _placed_on_live_nodes(pg: Any, timeout: float) -> bool:
    """Whether every bundle of `pg` is placed on a live node within `timeout` seconds (after a node is lost, Ray
    places its bundles again elsewhere if there is room: the table then shows RESCHEDULING, then CREATED)."""
    deadline = time.monotonic() + timeout
    while True:
        table = placement_group_table(pg)
        alive = {str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]
        nodes = [str(v) for v in table.get("bundles_to_node_id", {}).values()]
        if table.get("state") == "CREATED" and nodes and set(nodes) <= alive:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def members(pg: Any, count: int, name: str | None, distributed: bool) -> list[Member]:
    """Each member's identity; for an SPMD group also its torch.distributed environment, from where the placement
    group put each bundle."""
    infos = [ActorInfo(member_name(name, rank), rank, count, name) for rank in range(count)]
    if not distributed:
        return [Member(info) for info in infos]
    table = placement_group_table(pg)
    nodes_of = {int(k): str(v) for k, v in table["bundles_to_node_id"].items()}
    address_of = {str(n["NodeID"]): str(n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]
    master_node = nodes_of[0]
    per_node: dict[str, list[int]] = {}
    for rank in range(count):
        per_node.setdefault(nodes_of[rank], []).append(rank)
    # the rendezvous store listens on MASTER_ADDR alone (fray.runtime.rendezvous): loopback when no member is elsewhere
    master_addr = "127.0.0.1" if len(per_node) == 1 else address_of[master_node]
    port = _free_port_on(master_node, master_addr)
    out = []
    rendezvous = uuid.uuid4().hex  # this life's: members holding GPUs meet there to see each other's (_gpus)
    for rank, info in enumerate(infos):
        local = per_node[nodes_of[rank]]
        env = spmd_env(rank, count, master_addr, port, local.index(rank), len(local))
        out.append(Member(info, True, {**env, RENDEZVOUS_ENV: rendezvous}))
    return out


class RayGroups:
    """The actor groups of one context (`ctx`, which their handles call through): created through `actors`,
    their calls' pending arguments noted in `cancels`; the placement groups of non-detached groups made here."""

    def __init__(self, ctx: JobContext, actors: RayActors, cancels: CancelTracker, device_mode: str) -> None:
        self._ctx = ctx
        self._device_mode = device_mode  # how a call's device values travel (fray.runtime.device_shares)
        self._actors = actors
        self._cancels = cancels
        self._placement_groups: dict[Any, Any] = {}  # placement group id -> placement group
        self.gangs = GangWatch(actors.deaths.stopped)  # the SPMD groups made here fail as one (fray_ray._gangs)
        # calls made while an actor or a group restarts are sent again once it is back (fray_ray._resend)
        self.resend = Resender(self.gangs.member_now, self.gangs.await_back, self.gangs.sent_after_death)

    def create(self, klass: type, args: tuple[Any, ...], kwargs: dict[str, Any], group: GroupRequest) -> ActorGroup:
        """The members in one placement group, all or nothing: if any step fails, the members created so far
        are killed and the placement group removed."""
        options, count, distributed = group.member.options, group.count, group.distributed
        what = f"actor group {options.name or klass.__name__}"
        pg = create_placement_group(group.member, count, group.placement, group.strict, what)
        detached = options.lifetime is Lifetime.DETACHED
        # fray restarts an SPMD group as a whole (_gangs.py): its Ray actors never restart alone
        each = group.member
        if distributed:
            each = dataclasses.replace(each, options=dataclasses.replace(options, max_restarts=0))
        hangs = hang_timeout() if distributed else math.inf
        beats = {} if math.isinf(hangs) else {HEARTBEAT_ENV: str(heartbeat_interval(hangs))}

        def with_beats(group_members: list[Member], restarts: int = 0) -> list[Member]:
            return [
                dataclasses.replace(m, env={**m.env, **beats}, info=dataclasses.replace(m.info, restarts=restarts))
                for m in group_members
            ]

        try:
            first = with_beats(members(pg, count, options.name, distributed))
            handles = self._spawn(klass, args, kwargs, each, pg, first)
        except BaseException:
            remove_placement_group(pg)
            raise
        if not detached:
            self._placement_groups[pg.id] = pg
        if not distributed and options.max_restarts != 0:  # (Ray restarts each alone: _resend)
            self.resend.actors.update(h.payload._actor_id.binary() for h in handles)
        if distributed:

            def respawn(gang: RayGang) -> list[Any]:  # new members in the same bundles, a new MASTER_PORT
                # A bundle on a node that was lost is placed again by Ray on another (the group's MASTER_ADDR
                # then moves with rank 0's bundle): wait until every bundle has a live node.
                if not _placed_on_live_nodes(pg, PLACEMENT_TIMEOUT):
                    raise InfeasibleResourcesError(
                        f"{what}: Ray could not place its members again within {PLACEMENT_TIMEOUT:g} s after a "
                        f"node was lost (missing now: {_shortfall(bundle(group.member), count)})"
                    )
                fresh = with_beats(members(pg, count, options.name, True), gang.restarts)
                return [h.payload for h in self._spawn(klass, args, kwargs, each, pg, fresh)]

            label = group_label(klass.__name__, count, options.name)
            self.gangs.add(label, [h.payload for h in handles], options.max_restarts, respawn, hangs)
        return ActorGroup(handles, options.name, RayGroup(pg, count, detached), ctx=self._ctx)

    def _spawn(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        each: ActorRequest,
        pg: Any,
        group_members: list[Member],
    ) -> list[ActorHandle]:
        """One actor per member, member r in bundle r, each as `each` asks; all or nothing (the ones made are
        killed on a failure)."""
        # An unnamed group's members get a Ray name too (unique), so that Ray's ActorDiedError names the rank.
        ray_prefix = each.options.name or f"fray-group-{uuid.uuid4().hex[:12]}"
        handles: list[ActorHandle] = []
        try:
            for member in group_members:
                rank = member.info.rank
                extra: dict[str, Any] = {
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=rank, placement_group_capture_child_tasks=False
                    )
                }
                if each.options.name is None:
                    extra["name"] = f"{ray_prefix}/{rank}"
                handles.append(self._actors.create(klass, args, kwargs, member_request(each, member), member, extra))
        except BaseException:
            try:
                self._actors.kill(handles)
            except Exception:  # the creation error is the one to report
                pass
            raise
        return handles

    def call(self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[ObjectRef]:
        """One Ray call per member, with the arguments converted once; a large argument is put once and every
        member reads that one object (Ray resolves a top-level ref argument to its value)."""
        ray_args, ray_kwargs = unwrap_args(args, self._device_mode), unwrap_kwargs(kwargs, self._device_mode)
        if len(group.handles) > 1:
            ray_args, ray_kwargs = share_args(ray_args), share_kwargs(ray_kwargs)
        noted = ray_args is not args or ray_kwargs is not kwargs
        refs = []
        for handle, (actor, refused) in zip(group.handles, self._routes(group), strict=True):
            if refused is not None:
                refs.append(ObjectRef(refused, "ray"))
                self.resend.note(refs[-1], handle.payload, method, ray_args, ray_kwargs)  # (sent once it is back)
                continue
            restartable = bool(self.resend.actors) and actor._actor_id.binary() in self.resend.actors
            after_death = restartable and self.resend.made_after_death(actor)
            try:
                ref = getattr(actor, method).remote(*ray_args, **ray_kwargs)
            except TypeError as exc:
                if is_serialization_error(exc):
                    raise find_unserializable_argument(f"{handle.class_name}.{method}", args, kwargs, exc) from None
                raise
            if noted:
                hold_shares(ref, ray_args, ray_kwargs)
            result = ObjectRef(ref, "ray")
            if self.gangs.is_member(handle.payload):  # (an SPMD member: its call may outlive a death unsent)
                self.resend.note(result, handle.payload, method, ray_args, ray_kwargs)
            elif restartable:  # (a restartable member of a plain group)
                self.resend.note(result, actor, method, ray_args, ray_kwargs, after_death)
            if noted:
                self._cancels.note_dependencies(result, args, kwargs)
            refs.append(result)
        return refs

    def _routes(self, group: ActorGroup) -> list[tuple[Any, Any]]:
        """Where each member's call goes (GangWatch.route: an SPMD group restarted, restarting or dead), all in one
        life of the group: if one member's call is refused (it waits for the next life), every member's is. A
        collective split between lives hangs: a member sent to the new life waits there for a peer whose call
        waits to be sent (seen in CI on ray: gloo's 60 s timeout, one call refused and one sent after a kill)."""
        routes = [self.gangs.route(handle.payload) for handle in group.handles]
        refused = next((ref for _, ref in routes if ref is not None), None)
        if refused is None or all(ref is not None for _, ref in routes):
            return routes
        refusal = ray.get(refused)  # (a put of this process: at once)
        return [(None, ref if ref is not None else ray.put(refusal)) for _, ref in routes]

    def kill(self, group: ActorGroup) -> None:
        """Kill the members; a whole group (not a slice) also loses its placement group (removing it would kill
        every member in it, so a slice keeps it)."""
        replaced = self.gangs.killed([h.payload for h in group.handles])  # (members a restart made)
        methods = group.handles[0].methods
        now = [ActorHandle(a, "ray", group.class_name, methods, member_name(group.name, r)) for r, a in replaced]
        self._actors.kill([*group.handles, *now])
        payload = group.payload
        pg = None
        if isinstance(payload, RayGroup):
            if sorted(group.ranks) == list(range(payload.size)):
                pg = payload.placement_group
        elif group.name is not None and group.ranks == tuple(range(len(group))):
            try:  # a group found again by name (get_if_exists): its placement group is named after it
                pg = get_placement_group(pg_name(group.name))
            except ValueError:
                pg = None
        if pg is not None:
            self._placement_groups.pop(pg.id, None)
            try:
                remove_placement_group(pg)
            except Exception:  # removed already
                pass

    def remove_all(self) -> None:
        """Remove the placement groups of the non-detached groups created here (at shutdown: removing one kills
        its members)."""
        groups, self._placement_groups = self._placement_groups, {}
        for pg in groups.values():
            try:
                remove_placement_group(pg)
            except Exception:  # removed already, or Ray is gone
                pass
