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
  MASTER_ADDR is rank 0's node address, MASTER_PORT a port free on that node (picked here if rank 0's node is
  this process's node, else by a 0-CPU probe task pinned to that node), LOCAL_RANK / LOCAL_WORLD_SIZE count the
  members per node in rank order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fray.current import ActorInfo
from fray.errors import InfeasibleResourcesError
from fray.groups import Member, member_name, spmd_env
from fray.net import free_port
from fray.resources import EPS, actor_resources
from fray.types import ActorOptions, Lifetime

__all__ = ["DEFAULT_BUNDLE", "PLACEMENT_TIMEOUT", "RayGroup", "create_placement_group", "members", "pg_name"]

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


def bundle(options: ActorOptions) -> dict[str, float]:
    """One member's bundle: its resources without zeros, or DEFAULT_BUNDLE when it asks for nothing."""
    wanted = {name: float(qty) for name, qty in actor_resources(options).items() if qty > 0}
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
            short.append(f"{name}: needs {need:g}, {have:g} free")
    return "; ".join(short) if short else f"enough in total ({_fmt(available)}) but not laid out as asked"


def _fmt(resources: Any) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(dict(resources).items()) if not k.startswith("node:")) + "}"


def create_placement_group(
    options: ActorOptions, count: int, placement: str, strict: bool, what: str, timeout: float | None = None
) -> Any:
    """A placed Ray placement group with one bundle per member; InfeasibleResourcesError (and no placement group
    left behind) if Ray cannot place it within the timeout."""
    per_member = bundle(options)
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
    master_addr = address_of[master_node]
    port = _free_port_on(master_node, master_addr)
    per_node: dict[str, list[int]] = {}
    for rank in range(count):
        per_node.setdefault(nodes_of[rank], []).append(rank)
    out = []
    for rank, info in enumerate(infos):
        local = per_node[nodes_of[rank]]
        env = spmd_env(rank, count, master_addr, port, local.index(rank), len(local))
        out.append(Member(info, True, env))
    return out
