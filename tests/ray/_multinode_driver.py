"""Driver for test_multinode.py, run in its own process (Ray allows one connection per process).

Starts a two-node Ray cluster on this machine with ray.cluster_utils.Cluster (head: resource "head_tag",
worker: resource "worker_tag"), in a private temp dir; checks placement through fray; creates a named DETACHED
actor and looks it up from a second driver process; places actor groups (pack, spread, strict spread, an SPMD
group over both nodes running a gloo all_reduce); then kills what it made and stops exactly this cluster.
Prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

# Everything Ray writes (sessions, sockets, the "current cluster" file that a plain ray.init() would pick up)
# stays in a private temp dir, so no one else's ray.init() joins this cluster by accident.
TEMP_DIR = tempfile.mkdtemp(prefix="fray-mn-", dir="/tmp")
os.environ["RAY_TMPDIR"] = TEMP_DIR
os.makedirs(os.path.join(TEMP_DIR, "ray"))
# The nodes (and, by this choice, the drivers) run in token-auth mode, as a `ray start` cluster does by default.
# Nodes in Ray's other mode (no token auth) are joined in test_join_default_auth.py.
os.environ.setdefault("RAY_AUTH_MODE", "token")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import fray  # noqa: E402
from fray import ActorOptions, Lifetime, TaskOptions  # noqa: E402

SECOND_DRIVER = """
import sys, fray
ctx = fray.init(f"ray?address={sys.argv[1]}&namespace={sys.argv[2]}&log_to_driver=false")
actor = ctx.get_actor("mn-store")
print("SEEN", ctx.get(actor.where(), timeout=60), ctx.get(actor.bump(), timeout=60))
fray.shutdown()
"""


def where() -> str:
    return str(ray.get_runtime_context().get_node_id())


class Store:
    def __init__(self) -> None:
        self.count = 0

    def where(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def bump(self) -> int:
        self.count += 1
        return self.count


class Where:
    def node(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


class GlooRank:
    """An SPMD member: torch.distributed from the environment fray set before __init__."""

    def __init__(self) -> None:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))

    def info(self) -> dict[str, str | None]:
        names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        return {"node": str(ray.get_runtime_context().get_node_id()), **{n: os.environ.get(n) for n in names}}

    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t[0])


def groups(ctx: fray.JobContext, out: dict[str, object]) -> None:
    """Gang placement over the two nodes, and an SPMD group with one rank per node. Each group is killed once
    seen (its bundles hold CPU the next one needs); if a check fails, fray.shutdown removes what is left."""
    out["addresses"] = {str(n["NodeID"]): n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    for placement in ("pack", "spread"):
        group = ctx.create_actor_group(Where, 2, placement=placement)  # default bundles: 0.01 CPU each
        out[placement] = ctx.get(group.node(), timeout=120)
        ctx.kill(group)
    one_cpu = ActorOptions(resources={"CPU": 1})
    group = ctx.create_actor_group(Where, 2, options=one_cpu, placement="spread", strict_placement=True)
    out["strict_spread"] = ctx.get(group.node(), timeout=120)
    ctx.kill(group)
    try:
        ctx.create_actor_group(Where, 2, options=one_cpu, placement="pack", strict_placement=True)
        out["strict_pack"] = "accepted"
    except fray.InfeasibleResourcesError:
        out["strict_pack"] = "refused"
    spmd = ctx.create_actor_group(GlooRank, 2, placement="spread", strict_placement=True, distributed=True)
    out["spmd"] = ctx.get(spmd.info(), timeout=180)
    out["all_reduce"] = ctx.get(spmd.all_reduce(1.5), timeout=120)
    ctx.kill(spmd)


def checks(ctx: fray.JobContext, cluster: Cluster, out: dict[str, object]) -> None:
    """Placement of tasks and actors by resource, a detached actor seen by a second driver, groups."""
    out["nodes"] = len(ctx.node_resources())
    on = {tag: TaskOptions(resources={tag: 1}) for tag in ("head_tag", "worker_tag")}
    out["task_head"] = ctx.get(ctx.create_task(where, options=on["head_tag"]), timeout=120)
    out["task_worker"] = ctx.get(ctx.create_task(where, options=on["worker_tag"]), timeout=120)
    store = ctx.create_actor(
        Store,
        options=ActorOptions(name="mn-store", lifetime=Lifetime.DETACHED, resources={"worker_tag": 0.5}),
    )
    out["actor"] = ctx.get(store.where(), timeout=120)
    ctx.get(store.bump(), timeout=60)
    second = subprocess.run(
        [sys.executable, "-c", SECOND_DRIVER, cluster.address, "fray-mn"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    seen = [line for line in second.stdout.splitlines() if line.startswith("SEEN")]
    out["second_driver"] = seen[0].split()[1:] if seen else second.stderr[-2000:]
    try:
        ctx.create_task(where, options=TaskOptions(resources={"nowhere_tag": 1}))
        out["infeasible"] = "accepted"
    except fray.InfeasibleResourcesError:
        out["infeasible"] = "refused"
    ctx.kill(store)
    groups(ctx, out)


def main() -> None:
    temp_dir = TEMP_DIR
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"head_tag": 1},
            "object_store_memory": 100_000_000,
            "temp_dir": os.path.join(temp_dir, "ray"),
            "include_dashboard": False,
        },
    )
    out: dict[str, object] = {}
    try:
        worker = cluster.add_node(num_cpus=1, resources={"worker_tag": 1}, object_store_memory=100_000_000)
        cluster.wait_for_nodes()
        out["head"] = cluster.head_node.node_id
        out["worker"] = worker.node_id
        ctx = fray.init(f"ray?address={cluster.address}&namespace=fray-mn&log_to_driver=false")
        try:
            checks(ctx, cluster, out)
        finally:
            fray.shutdown()  # before cluster.shutdown, which refuses to remove the node a driver is connected to
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
