"""Actor groups: N actors of one class created together, called together, results gathered by rank.

`ctx.create_actor_group(Cls, 4)` returns an `ActorGroup`; `group.step(x)` calls `step(x)` on every member and
returns one ObjectRef per member in rank order, so `ctx.get(group.step(x))` is the ranked gather. Slicing gives a
smaller group over the same actors (members keep the rank they were created with). Backends may serve a group
call as one broadcast (monarch: one mesh call); the default sends one call per member.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from fray.errors import ActorAlreadyExistsError, ActorNotFoundError, InfeasibleResourcesError
from fray.host.net import free_port
from fray.runtime import current
from fray.runtime.capabilities import Capability
from fray.runtime.current import ActorInfo
from fray.runtime.refs import ActorHandle, ObjectRef
from fray.runtime.rendezvous import AGENT_STORE_ENV
from fray.runtime.requests import ActorRequest, GroupRequest
from fray.runtime.resources import capacity, format_resources
from fray.types import Lifetime

__all__ = [
    "PLACEMENTS",
    "ActorGroup",
    "GroupContext",
    "GroupMethod",
    "Member",
    "check_group_feasible",
    "create_one_by_one",
    "existing_group",
    "local_members",
    "member_request",
    "spmd_env",
]

PLACEMENTS = ("pack", "spread")


class GroupContext(Protocol):
    """What groups need of their job context (a fray.context.JobContext, which this module does not import: the
    context is built on groups)."""

    def require(self, capability: Capability, used: str = "") -> None: ...

    def node_resources(self) -> list[dict[str, float]]: ...

    def _call_group_checked(
        self, group: ActorGroup, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[ObjectRef]: ...

    def _create_actor(
        self,
        klass: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        request: ActorRequest,
        member: Member | None = None,
    ) -> ActorHandle: ...

    def _get_actor(self, name: str) -> ActorHandle: ...

    def _kill(self, handle: ActorHandle) -> None: ...


@dataclass(frozen=True)
class Member:
    """What a backend needs to create one member of a group: who it is, and (for an SPMD group) the environment
    variables to set in its own process before its __init__ runs."""

    info: ActorInfo
    distributed: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    gang: Any = None  # the backend's record of its SPMD group, shared by the members (fail/restart together)


class GroupMethod:
    """`group.method`: calling it calls the method on every member; returns their refs in rank order."""

    __slots__ = ("_group", "_name")

    def __init__(self, group: ActorGroup, name: str) -> None:
        self._group = group
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> list[ObjectRef]:
        return self._group.call(self._name, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<group method {self._group.class_name}.{self._name} x{len(self._group)}>"


class ActorGroup:
    """Actors created together. `group.m(...)` -> one ref per member, rank order; `group[i]` -> ActorHandle;
    `group[a:b]`, `group[[i, j]]` -> ActorGroup; `len(group)`; `group.handles`; `ctx.kill(group)`.

    `payload` is the backend's own description of the whole group (monarch: its mesh), shared by slices;
    `ranks` are the members' ranks in that group, in this group's order.
    """

    __slots__ = ("__weakref__", "_ctx", "handles", "name", "payload", "ranks")

    def __init__(
        self,
        handles: Sequence[ActorHandle],
        name: str | None = None,
        payload: Any = None,
        ranks: Sequence[int] | None = None,
        ctx: GroupContext | None = None,
    ) -> None:
        if not handles:
            raise ValueError("an actor group needs at least one member")
        self.handles: tuple[ActorHandle, ...] = tuple(handles)
        self.name = name
        self.payload = payload
        self.ranks: tuple[int, ...] = tuple(ranks) if ranks is not None else tuple(range(len(self.handles)))
        self._ctx = ctx

    @property
    def backend(self) -> str:
        return self.handles[0].backend

    @property
    def class_name(self) -> str:
        return self.handles[0].class_name

    def _context(self) -> GroupContext:
        return self._ctx if self._ctx is not None else cast(GroupContext, current.get_job_context())

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[ObjectRef]:
        """Call `method` on every member (also a method whose name a group attribute takes, like `handles`)."""
        self._check_method(method)
        return self._context()._call_group_checked(self, method, args, kwargs)

    def _check_method(self, method: str) -> None:
        if method.startswith("_") or method not in self.handles[0].methods:
            raise AttributeError(
                f"actor {self.class_name} has no method {method!r}; its methods are: "
                f"{', '.join(sorted(self.handles[0].methods))}"
            )

    def __getattr__(self, attr: str) -> GroupMethod:
        if attr.startswith("_"):
            raise AttributeError(attr)
        self._check_method(attr)
        return GroupMethod(self, attr)

    def __len__(self) -> int:
        return len(self.handles)

    def __iter__(self) -> Iterator[ActorHandle]:
        return iter(self.handles)

    def __getitem__(self, key: int | slice | Sequence[int]) -> Any:
        if isinstance(key, bool):
            raise TypeError("an actor group is indexed by an int, a slice or a list of ints, not a bool")
        if isinstance(key, int):
            return self.handles[key]
        if isinstance(key, slice):
            picked = list(range(len(self.handles)))[key]
        elif isinstance(key, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in key):
            picked = [range(len(self.handles))[i] for i in key]  # IndexError for an index out of range
        else:
            raise TypeError(f"an actor group is indexed by an int, a slice or a list of ints, got {key!r}")
        if not picked:
            raise IndexError(f"{key!r} selects no member of this group of {len(self.handles)}")
        return ActorGroup(
            [self.handles[i] for i in picked], self.name, self.payload, [self.ranks[i] for i in picked], self._ctx
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # As handles do, a group binds to the context current where it lands.
        return (ActorGroup, (self.handles, self.name, self.payload, self.ranks))

    def __repr__(self) -> str:
        label = f" name={self.name!r}" if self.name else ""
        return f"ActorGroup({self.backend}:{self.class_name} x{len(self.handles)}{label})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorGroup) and self.handles == other.handles

    def __hash__(self) -> int:
        return hash(self.handles)


def member_name(group: str | None, rank: int) -> str | None:
    """The actor name of a named group's member (found with ctx.get_actor)."""
    return None if group is None else f"{group}/{rank}"


def _capacity(node: Mapping[str, float], per_member: Mapping[str, float]) -> float:
    """How many members fit on a node (inf when they ask for nothing)."""
    return capacity(node, per_member) if any(q > 0 for q in per_member.values()) else math.inf


def check_group_feasible(
    nodes: Sequence[Mapping[str, float]],
    per_member: Mapping[str, float],
    count: int,
    placement: str,
    strict: bool,
    what: str,
) -> None:
    """Refuse a group whose members could never all be placed (Ray would wait forever on its placement group).

    strict "pack": every member on one node. strict "spread": every member on a different node. Otherwise
    (best effort) the members must fit on the nodes in total.
    """
    capacities = [_capacity(node, per_member) for node in nodes]
    if strict and placement == "pack":
        ok = any(c >= count for c in capacities)
        need = f"one node with room for all {count} members"
    elif strict and placement == "spread":
        ok = sum(1 for c in capacities if c >= 1) >= count
        need = f"{count} nodes with room for one member each"
    else:
        ok = sum(capacities) >= count
        need = f"room for {count} members over all nodes"
    if ok:
        return
    room = ", ".join(f"{c:g}" for c in capacities) or "no nodes"
    hint = " Use strict_placement=False, fewer members, or smaller requests." if strict else ""
    raise InfeasibleResourcesError(
        f"{what}: {count} members x {format_resources(per_member) if per_member else 'no resources'} with "
        f"placement={placement!r}"
        f"{' (strict)' if strict else ''} needs {need}; the {len(nodes)} node(s) of this context have room for "
        f"[{room}] members each.{hint}"
    )


def spmd_env(
    rank: int,
    size: int,
    master_addr: str,
    master_port: int,
    local_rank: int | None = None,
    local_size: int | None = None,
) -> dict[str, str]:
    """The torch.distributed environment of one SPMD member (what torchrun sets), with rank 0's process serving
    the rendezvous store bound to `master_addr` alone (fray.runtime.rendezvous: torch's own listens on every
    interface)."""
    env = {
        AGENT_STORE_ENV: "True",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(size if local_size is None else local_size),
    }
    if master_addr.startswith("127."):  # gloo picks its interface from the hostname, which may not be loopback
        env["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    return env


def admit_group(ctx: GroupContext, klass: type, group: GroupRequest) -> ActorGroup | None:
    """create_actor_group's shared rules, once its arguments are checked: refuse what the backend lacks
    (detached members, SPMD, restarting an SPMD group as a whole); return the live group of that name if asked to
    reuse it; refuse a group that could never be placed. None: make it."""
    options, count = group.member.options, group.count
    if options.lifetime is Lifetime.DETACHED:
        ctx.require(Capability.DETACHED_ACTORS, "ActorOptions(lifetime=Lifetime.DETACHED)")
    if group.distributed:
        ctx.require(Capability.SPMD_GROUPS, "create_actor_group(distributed=True)")
        if options.max_restarts != 0:  # per-member restarts would leave the group's collectives broken for good
            ctx.require(
                Capability.SPMD_GANG_RESTART,
                "create_actor_group(distributed=True, options=ActorOptions(max_restarts=N)) (restarting an "
                "SPMD group as a whole: this backend cannot yet; use max_restarts=0)",
            )
    if options.name is not None:
        existing = existing_group(ctx, options.name, count, options.get_if_exists)
        if existing is not None:
            return existing
    what = f"actor group {options.name or klass.__name__}"
    need = group.member.resource_dict()
    check_group_feasible(ctx.node_resources(), need, count, group.placement, group.strict, what)
    return None


def existing_group(ctx: GroupContext, name: str, count: int, get_if_exists: bool) -> ActorGroup | None:
    """The live group called `name` of `count` members (None if there is none); ActorAlreadyExistsError unless
    get_if_exists."""
    try:
        first = ctx._get_actor(member_name(name, 0) or "")
    except ActorNotFoundError:
        return None
    if not get_if_exists:
        raise ActorAlreadyExistsError(
            f"an actor group named {name!r} exists already; pass ActorOptions(get_if_exists=True) to reuse it, "
            "or pick another name"
        )
    handles = [first]
    try:
        handles += [ctx._get_actor(member_name(name, rank) or "") for rank in range(1, count)]
    except ActorNotFoundError as exc:
        raise ActorNotFoundError(
            f"the actor group {name!r} has lost members or has fewer than {count}: {exc}"
        ) from None
    try:
        ctx._get_actor(member_name(name, count) or "")
    except ActorNotFoundError:
        return ActorGroup(handles, name, ctx=ctx)
    raise ValueError(f"the actor group {name!r} has more than {count} members; ask for its real size")


def local_members(count: int, name: str | None, distributed: bool) -> list[Member]:
    """The members of a group all on this host (the default placement): ranks, and for an SPMD group the
    torch.distributed environment with rank 0's address on loopback."""
    port = free_port() if distributed else 0
    return [
        Member(
            ActorInfo(member_name(name, rank), rank, count, name),
            distributed,
            spmd_env(rank, count, "127.0.0.1", port) if distributed else {},
        )
        for rank in range(count)
    ]


def create_one_by_one(
    ctx: GroupContext,
    klass: type,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    group: GroupRequest,
    gang: Any = None,
) -> ActorGroup:
    """A group whose members are created one by one through `ctx._create_actor(..., member=...)` (the default
    JobContext._create_actor_group); if one cannot be created, the ones created are killed. `gang` goes to every
    member (Member.gang)."""
    options = group.member.options
    handles: list[ActorHandle] = []
    try:
        for member in local_members(group.count, options.name, group.distributed):
            member = dataclasses.replace(member, gang=gang)
            handles.append(ctx._create_actor(klass, args, kwargs, member_request(group.member, member), member=member))
    except BaseException:
        for handle in handles:
            try:
                ctx._kill(handle)
            except Exception:  # the creation error is the one to report
                pass
        raise
    return ActorGroup(handles, options.name, ctx=ctx)


def member_request(request: ActorRequest, member: Member) -> ActorRequest:
    """What one member of a group asks: what each member of the group asks (`request`), under the member's own
    name ("group/rank"), never reusing a live actor of that name."""
    name = member.info.name
    options = dataclasses.replace(request.options, name=name, get_if_exists=False)
    return dataclasses.replace(request, options=options, name=name or request.name)
