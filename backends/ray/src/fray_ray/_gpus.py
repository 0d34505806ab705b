"""An SPMD member's view of its group's GPUs on Ray, so that `torch.cuda.set_device(LOCAL_RANK)` picks its own.

Ray shows each actor only the GPUs it assigned to it (CUDA_VISIBLE_DEVICES), and assigns them when the actor
starts. torchrun's members, and Ray Train's workers, see every device of their group on their node, in local
rank order: LOCAL_RANK indexes them, and NCCL can use peer-to-peer copies between them. So before the user's
__init__, each member that holds GPUs says which in Ray's internal KV (under the group's rendezvous id, made
afresh for each life of the group), waits until every member has, and widens its CUDA_VISIBLE_DEVICES to its
node's members' devices in rank order. CUDA reads the variable at its first use, which must come later: a
constructor argument holding a CUDA tensor starts CUDA where it is unpickled, before __init__, so the view is set
while the arguments are unpickled, by a first argument (`GroupView`) that Ray unpickles before the others.
"""

from __future__ import annotations

import json
import logging
import os
import time

import ray
from ray.experimental import internal_kv

from fray.backend import ENV_HELD, settings, use_held_device

__all__ = ["RENDEZVOUS_ENV", "GroupView", "ViewSeen", "see_group_gpus"]

log = logging.getLogger("fray.ray")

RENDEZVOUS_ENV = settings.GPU_RENDEZVOUS.name  # in an SPMD member's env: its group life's id
RENDEZVOUS_TIMEOUT = 120.0  # seconds for every member to start; past it a member keeps its own view (and says so)


def _key(rendezvous: str, rank: int) -> bytes:
    return f"fray-gpus/{rendezvous}/{rank}".encode()


_seen: set[str] = set()  # the rendezvous this process has seen its group's devices at (once each)


class ViewSeen:
    """What a GroupView becomes where it is unpickled: the member's view is set (__init__ drops it)."""

    __slots__ = ()


class GroupView:
    """An SPMD member's first constructor argument: unpickled in the member's process before its other arguments
    (Ray unpickles them in order, after it has set the member's own CUDA_VISIBLE_DEVICES), it sets the member's
    view of its group's devices there, so that no argument starts CUDA with the member's own view alone."""

    __slots__ = ("env",)

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __reduce__(self) -> tuple[object, ...]:
        return (_view_on_arrival, (self.env,))


def _view_on_arrival(env: dict[str, str]) -> ViewSeen:
    see_group_gpus(env)
    return ViewSeen()


def see_group_gpus(env: dict[str, str]) -> None:
    """In an SPMD member's process, before its arguments are unpickled (env: its torch.distributed variables).
    Once per rendezvous: a later call (start_actor's) does nothing."""
    rendezvous = settings.GPU_RENDEZVOUS.read(env)
    mine = [str(i) for i in ray.get_gpu_ids()]
    if not rendezvous or not mine or rendezvous in _seen:
        return
    _seen.add(rendezvous)
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    node = ray.get_runtime_context().get_node_id()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(mine))
    entry = {"node": node, "ids": mine, "visible": visible.split(",")}
    internal_kv._internal_kv_put(_key(rendezvous, rank), json.dumps(entry).encode(), overwrite=True)
    os.environ[ENV_HELD] = ",".join(mine)
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT
    entries: dict[int, dict[str, object]] = {}
    while len(entries) < size:
        for other in range(size):
            if other not in entries:
                raw = internal_kv._internal_kv_get(_key(rendezvous, other))
                if raw is not None:
                    entries[other] = json.loads(raw)
        if len(entries) < size:
            if time.monotonic() > deadline:
                log.warning(
                    "fray: SPMD member %d saw %d of %d members' GPUs after %.0f s: it sees only its own",
                    rank, len(entries), size, RENDEZVOUS_TIMEOUT,
                )  # fmt: skip
                return
            time.sleep(0.05)
    group = [d for r in range(size) if entries[r]["node"] == node for d in entries[r]["visible"]]  # type: ignore[attr-defined]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(dict.fromkeys(group))  # members sharing a device: named once
    use_held_device()
    _clean_up(rendezvous, rank, size)


def _clean_up(rendezvous: str, rank: int, size: int) -> None:
    """Say this member has read every entry; whoever sees that all have removes the rendezvous's keys (a member
    marks itself only after reading them all, so none is removed under a reader)."""
    internal_kv._internal_kv_put(f"fray-gpus/{rendezvous}/seen/{rank}".encode(), b"1", overwrite=True)
    if all(internal_kv._internal_kv_exists(f"fray-gpus/{rendezvous}/seen/{r}".encode()) for r in range(size)):
        internal_kv._internal_kv_del(f"fray-gpus/{rendezvous}/".encode(), del_by_prefix=True)
