"""Driver for test_ray_multihost.py, run inside namespaced host 0 (its own network stack, hostname and /dev/shm) against
a Ray cluster of two hosts: the head on host 0 (resource "head_tag"), a worker node on host 1 ("worker_tag").

Checks placement by resources, a named DETACHED actor seen from a second driver on host 1, infeasible resources
refused, actor groups (pack, spread, strict spread, strict pack refused, SPMD with gloo), and data and work across
the hosts; prints them as one `RESULT <json>` line. Then it leaves an actor and stored values on each host, prints
`HOLDING <json>` (its Ray job and every worker process that ran its code), and sleeps until the test SIGKILLs it.
Each remote function reports `socket.gethostname()`: every host has its own hostname.

    python _multihost_driver.py HEAD_ADDRESS:PORT HOST1_PREFIX_JSON
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np
import ray

import fray
from fray import ActorOptions, Lifetime, TaskOptions
from fray.host import procfs

NAMESPACE = "fray-mh"
PUT_BYTES = 32 * 2**20
MADE_BYTES = 16 * 2**20
# A small share of a host's tag pins work there, and leaves the tag to everything else pinned there meanwhile
# (the actors holding a share are alive while tasks are pinned to the same host). Actors take no CPU by default.
PIN = 0.01
ON_HEAD = TaskOptions(resources={"head_tag": PIN})
ON_WORKER = TaskOptions(resources={"worker_tag": PIN})
ACTOR_ON = {"head": ActorOptions(resources={"head_tag": PIN}), "worker": ActorOptions(resources={"worker_tag": PIN})}

SECOND_DRIVER = """
import socket, sys, fray
ctx = fray.init(f"ray?address={sys.argv[1]}&namespace={sys.argv[2]}&log_to_driver=false")
store = ctx.get_actor("mh-store")
seen = ctx.get(store.where(), timeout=120)
print("SEEN", socket.gethostname(), seen["host"], ctx.get(store.bump(), timeout=120), flush=True)
fray.shutdown()
"""


def where() -> dict[str, Any]:
    """Where this runs: host name, Ray node, and process (pid and start time: which process, even if its pid is
    reused later) for the test's check that each such process is gone with the job."""
    me = procfs.stat(os.getpid())
    assert me is not None  # (this process runs)
    node = ray.get_runtime_context().get_node_id()
    return {"host": socket.gethostname(), "node": node, "pid": os.getpid(), "start": me.start}


def summed(x: Any) -> dict[str, Any]:
    return {**where(), "sum": int(x.sum()), "nbytes": int(x.nbytes)}


def made(n: int) -> tuple[dict[str, Any], Any]:
    return where(), np.full(n, 2, dtype=np.uint8)


def nested() -> dict[str, Any]:
    """Submits tasks of its own, pinned to each host, through the job context fray gives a task."""
    ctx = fray.get_job_context()
    inner = ctx.get([ctx.create_task(where, options=o) for o in (ON_HEAD, ON_WORKER)], timeout=120)
    return {**where(), "inner": inner}


class Store:
    def __init__(self) -> None:
        self.count = 0

    def where(self) -> dict[str, Any]:
        return where()

    def bump(self) -> int:
        self.count += 1
        return self.count


class Node:
    """An actor that makes a value on its host and reads one made elsewhere."""

    def where(self) -> dict[str, Any]:
        return where()

    def make(self, n: int, fill: int) -> Any:
        return np.full(n, fill, dtype=np.uint8)

    def read(self, x: Any) -> dict[str, Any]:
        return summed(x)


class GlooRank:
    """An SPMD member: torch.distributed from the environment fray set before __init__."""

    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))

    def info(self) -> dict[str, Any]:
        names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        return {**where(), **{n: os.environ.get(n) for n in names}}

    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t[0])


class Seen:
    """Every place the driver's code ran, for the test's check that the job leaves no process behind."""

    def __init__(self) -> None:
        self.places: list[dict[str, Any]] = []

    def __call__(self, found: Any) -> Any:
        for item in found if isinstance(found, list) else [found]:
            self.places.append(item)
            self.places.extend(item.get("inner", []))
        return found


def placement(ctx: fray.JobContext, second: list[str], address: str, seen: Seen, out: dict[str, Any]) -> None:
    """Tasks and actors placed by resource; a detached actor seen from a second driver on host 1; infeasible."""
    out["task_head"] = seen(ctx.get(ctx.create_task(where, options=ON_HEAD), timeout=120))
    out["task_worker"] = seen(ctx.get(ctx.create_task(where, options=ON_WORKER), timeout=120))
    detached = ActorOptions(name="mh-store", lifetime=Lifetime.DETACHED, resources={"worker_tag": PIN})
    store = ctx.create_actor(Store, options=detached)
    out["actor"] = seen(ctx.get(store.where(), timeout=120))
    ctx.get(store.bump(), timeout=60)
    run = subprocess.run(
        [*second, sys.executable, "-c", SECOND_DRIVER, address, NAMESPACE], capture_output=True, text=True, timeout=180
    )
    lines = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("SEEN")]
    out["second_driver"] = lines[0] if lines else run.stderr[-2000:]
    ctx.kill(store)  # detached: it would outlive this driver, which must leave nothing
    try:
        ctx.create_task(where, options=TaskOptions(resources={"nowhere_tag": 1}))
        out["infeasible"] = "accepted"
    except fray.InfeasibleResourcesError:
        out["infeasible"] = "refused"


def groups(ctx: fray.JobContext, seen: Seen, out: dict[str, Any]) -> None:
    """Gang placement over the two hosts, and an SPMD group with one rank per host. Each group is killed once seen
    (its bundles hold CPU the next one needs)."""
    for kind in ("pack", "spread"):
        group = ctx.create_actor_group(Node, 2, placement=kind)  # default bundles: 0.01 CPU each
        out[kind] = seen(ctx.get(group.where(), timeout=120))
        ctx.kill(group)
    one_cpu = ActorOptions(resources={"CPU": 1})
    group = ctx.create_actor_group(Node, 2, options=one_cpu, placement="spread", strict_placement=True)
    out["strict_spread"] = seen(ctx.get(group.where(), timeout=120))
    ctx.kill(group)
    try:
        ctx.create_actor_group(Node, 2, options=one_cpu, placement="pack", strict_placement=True)
        out["strict_pack"] = "accepted"
    except fray.InfeasibleResourcesError:
        out["strict_pack"] = "refused"
    spmd = ctx.create_actor_group(GlooRank, 2, placement="spread", strict_placement=True, distributed=True)
    out["spmd"] = seen(ctx.get(spmd.info(), timeout=180))
    out["all_reduce"] = ctx.get(spmd.all_reduce(1.5), timeout=120)
    ctx.kill(spmd)


def across(ctx: fray.JobContext, nodes: dict[str, Any], seen: Seen, out: dict[str, Any]) -> None:
    """Work and data crossing between the hosts."""
    out["remote_tasks"] = seen(ctx.get([ctx.create_task(where, options=ON_WORKER) for _ in range(4)], timeout=120))
    put = ctx.put(np.ones(PUT_BYTES, dtype=np.uint8))
    out["put_read"] = seen(ctx.get(ctx.create_task(summed, args=(put,), options=ON_WORKER), timeout=120))
    del put
    place, value = ctx.get(ctx.create_task(made, args=(MADE_BYTES,), options=ON_WORKER), timeout=120)
    out["task_result"] = {**seen(place), "sum": int(value.sum()), "nbytes": int(value.nbytes)}
    del value
    out["actors"] = {side: seen(ctx.get(node.where(), timeout=120)) for side, node in nodes.items()}
    for src, dst in (("head", "worker"), ("worker", "head")):
        ref = nodes[src].make(MADE_BYTES, 3)
        out[f"{src}_to_{dst}"] = seen(ctx.get(nodes[dst].read(ref), timeout=120))
        del ref
    out["nested"] = seen(ctx.get(ctx.create_task(nested, options=ON_WORKER), timeout=180))


def main() -> None:
    address, second = sys.argv[1], json.loads(sys.argv[2])
    out: dict[str, Any] = {"driver_host": socket.gethostname(), "driver_pid": os.getpid()}
    start = time.monotonic()
    ctx = fray.init(f"ray?address={address}&namespace={NAMESPACE}&log_to_driver=false")
    out["init_seconds"] = round(time.monotonic() - start, 2)
    out["auth_mode"] = os.environ.get("RAY_AUTH_MODE")  # what fray chose, asking the cluster (nobody set it)
    out["node_count"] = len(ctx.node_resources())
    out["addresses"] = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]
    seen = Seen()
    placement(ctx, second, address, seen, out)
    groups(ctx, seen, out)
    nodes = {side: ctx.create_actor(Node, options=options) for side, options in ACTOR_ON.items()}
    across(ctx, nodes, seen, out)
    out["seconds"] = round(time.monotonic() - start, 1)
    print("RESULT " + json.dumps(out), flush=True)
    # What the SIGKILL must not leave behind: an actor and stored values on each host (a put lives on the driver's).
    kept = [nodes[side].make(MADE_BYTES, 4) for side in ("head", "worker")]
    ctx.wait(kept, num_returns=2, timeout=120)
    kept.append(ctx.put(np.ones(MADE_BYTES, dtype=np.uint8)))
    job = ray.get_runtime_context().get_job_id()
    print("HOLDING " + json.dumps({"job": job, "places": seen.places}), flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
