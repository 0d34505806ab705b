"""One fray actor of a monarch context as the driver keeps it (ActorRegistry, GroupRegistry, gangs and ActorHolds
share it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fray.backend import ActorInfo, ActorOptions, ActorState
from fray_monarch.core.protocol import ActorDesc, WireValue
from fray_monarch.driver.proc_rec import Proc

__all__ = ["ActorRec"]


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

    @property
    def desc(self) -> ActorDesc:
        return self.id, self.class_name, self.methods, self.name
