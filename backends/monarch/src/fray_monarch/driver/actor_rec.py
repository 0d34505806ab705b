"""One fray actor of a monarch context as the driver keeps it (ActorRegistry, GroupRegistry, gangs and ActorHolds
share it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fray.backend import ActorInfo, ActorOptions, ActorState
from fray_monarch.core.protocol import ActorDesc, WireValue
from fray_monarch.driver.directory import Entry
from fray_monarch.driver.proc_rec import Proc

__all__ = ["ActorRec", "HeldCall"]


class HeldCall(NamedTuple):
    """A call to an actor kept back until its restart: sent then, or failed if the actor dies instead."""

    actor: ActorRec
    entry: Entry
    method: str
    args: WireValue
    deps: list[str]


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
    reserved: list[tuple[Proc, dict[str, float]]] = field(default_factory=list)  # or its host's (more than a share)
    gpus: tuple[int, ...] = ()  # the devices it holds on its process's host (fray.runtime.gpus)
    group: Any = None  # the GroupRec of a group member (group_rec.py)
    slot: tuple[int, int] | None = None  # (block, flat index) in its group's mesh; None once on a process of its own
    inflight: set[str] = field(default_factory=set)  # its calls sent by group broadcast, not answered yet
    calls: dict[str, Any] = field(default_factory=dict)  # id -> Entry: its calls sent to it alone, not answered yet
    streams: dict[str, tuple[Any, int]] = field(default_factory=dict)  # open streams: id -> (StreamRec, restarts)
    waiting: list[HeldCall] = field(default_factory=list)  # calls made after its process died, before that news

    @property
    def can_restart(self) -> bool:
        return self.options.max_restarts == -1 or self.restarts < self.options.max_restarts

    @property
    def died_unseen(self) -> bool:
        """A call to it failed as its process died, and fray's news of that death has not come yet."""
        return self.proc is not None and self.proc.died_in_a_call

    @property
    def label(self) -> str:
        """How errors name it: class, name (a group member's is "group/rank") and rank in its group."""
        who = f"{self.class_name} {self.name!r}" if self.name else f"{self.class_name} {self.id}"
        if self.info.group is not None or self.info.size > 1:
            who += f" (rank {self.info.rank} of {self.info.size})"
        return who

    @property
    def desc(self) -> ActorDesc:
        return self.id, self.class_name, self.methods, self.name

    def wait_for_restart(self, entry: Entry, method: str, args: WireValue, deps: list[str]) -> bool:
        """Under the lock: a call made after one of its calls failed as its process died, before fray's news of
        that death (the pool's watch of the process can come later): it waits for the restart that news brings,
        or fails if the actor is dead by then. False when its process is not known to have died."""
        if not self.died_unseen:
            return False
        self.waiting.append(HeldCall(self, entry, method, args, deps))
        return True
