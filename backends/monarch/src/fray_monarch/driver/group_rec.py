"""One actor group of a monarch context as the driver keeps it (GroupRegistry in meshgroups.py, and gangs.py for
SPMD groups, share it): its process meshes ("blocks", each with its member and WorkerHost actor meshes), its members,
and the state of its restarts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fray.errors import FrayError
from fray_monarch.core.protocol import WireValue
from fray_monarch.driver.actor_rec import ActorRec, HeldCall
from fray_monarch.driver.directory import Entry


@dataclass
class Block:
    """One process mesh of a group and the two actor meshes on it (the members, and a WorkerHost per process for
    frees, stream stops and death watches). 1-D (procs) on one host, or 2-D (hosts x procs) over attached hosts."""

    procs: Any
    actors: Any
    workers: Any
    hosts: list[int]  # the fray host of each row
    per_host: int
    two_d: bool
    first_rank: int  # the group rank of flat index 0
    size: int

    def member(self, mesh: Any, index: int) -> Any:
        """The one-actor slice of `mesh` (actors or workers) at flat index `index`."""
        if self.two_d:
            return mesh.slice(hosts=index // self.per_host, procs=index % self.per_host)
        return mesh.slice(procs=index)

    def targets(self, indices: list[int]) -> list[Any]:
        """The fewest slices of the member mesh that cover exactly these (sorted) flat indices."""
        if indices == list(range(self.size)):
            return [self.actors]
        runs: list[list[int]] = []
        for index in indices:
            if runs and index == runs[-1][-1] + 1 and (not self.two_d or index % self.per_host != 0):
                runs[-1].append(index)  # the next one, in the same host row
            else:
                runs.append([index])
        out = []
        for run in runs:
            if len(run) == 1:
                out.append(self.member(self.actors, run[0]))
            elif self.two_d:
                row = run[0] // self.per_host
                start = run[0] % self.per_host
                out.append(self.actors.slice(hosts=row, procs=slice(start, start + len(run))))
            else:
                out.append(self.actors.slice(procs=slice(run[0], run[-1] + 1)))
        return out


@dataclass
class GroupRec:
    id: str
    name: str | None
    blocks: list[Block] = field(default_factory=list)
    members: list[ActorRec] = field(default_factory=list)  # by rank
    label: str = ""  # how errors name it (fray.runtime.gang.group_label)
    distributed: bool = False  # an SPMD group: one member's death is the whole group's (gangs.py)
    placement: str = "pack"  # (a restart that must leave a lost host places its members by it again)
    max_restarts: int = 0
    restarts: int = 0  # how many times the whole group has been restarted
    generation: int = 0  # +1 at each failure (a restart's late news of an earlier life is ignored)
    initializing: int = 0  # members whose __init__ of the current restart has not returned
    inits: list[Any] = field(default_factory=list)  # its blocks' __init__ broadcasts at creation (done: returned)
    up_since: float | None = None  # (monotonic) when every member's __init__ was seen returned, else None (gangs.py)
    error: FrayError | None = None  # while it restarts (ActorUnavailableError) or once dead (ActorDiedError)
    hang_timeout: float = math.inf  # seconds a member's process may leave a ping unanswered (gangs.py)
    dead: bool = False
    held: dict[str, Entry] = field(default_factory=dict)  # members' lost-peer errors waiting (ActorRegistry.hold)
    calls: dict[str, Entry] = field(default_factory=dict)  # SPMD members' pending calls sent alone (send_one)
    # calls made while it restarts, sent once every member is back (gangs.py); (member, entry, method, args, deps)
    waiting: list[HeldCall] = field(default_factory=list)

    def member_exiting(self) -> bool:
        """A member's process on this machine has begun to exit, or (its pid not known yet: the worker's first
        answer can come late) a call to it failed as it died: the group's failure is coming."""
        return any(m.proc is not None and m.proc.dying() for m in self.members)

    def wait_for_restart(self, rec: ActorRec, entry: Entry, method: str, args: WireValue, deps: list[str]) -> bool:
        """Under the lock: a call to member `rec` made while the SPMD group restarts, or after a member's process
        began to exit (fray learns of that death only once the process has ended: the call was in flight at no
        death), waits for the restart; False when the group is dead (the call fails with its error) or nothing is
        wrong."""
        if self.dead or (self.error is None and not self.member_exiting()):
            return False
        self.waiting.append(HeldCall(rec, entry, method, args, deps))
        return True
