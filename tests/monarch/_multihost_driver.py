"""Driver for test_multihost.py, run inside namespaced host 1 (its own network stack, hostname and /dev/shm):
every cross-host check of one way of getting hosts, printed as one `RESULT <json>` line. Then it keeps processes
and stored values on every host and prints HOLDING, for the test to SIGKILL it and check that nothing it started
is left anywhere.

    python _multihost_driver.py SPEC BIG_BYTES [placement]

`placement` adds the group placement checks (pack, an even spread as one 2-D mesh, an uneven one).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any

import numpy as np

import fray


def hostname() -> str:
    return socket.gethostname()


def rss() -> int:
    """This process's resident memory, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def summed(x: Any) -> tuple[str, int, int]:
    return socket.gethostname(), int(x.sum()), int(x.nbytes)


def made(n: int) -> Any:
    return np.full(n, 2, dtype=np.uint8)


def nested(n: int) -> tuple[str, list[str]]:
    ctx = fray.get_job_context()
    return socket.gethostname(), ctx.get([ctx.create_task(hostname) for _ in range(n)], timeout=120)


class Node:
    """An actor that makes a large value on its host and reads one made on another."""

    def where(self) -> str:
        return socket.gethostname()

    def make(self, n: int) -> Any:
        return np.full(n, 1, dtype=np.uint8)

    def read(self, x: Any) -> tuple[str, int]:
        return socket.gethostname(), int(x.sum())


class Caster:
    """Says where it runs and how Monarch delivered the message it answers (the size of the mesh it was cast to)."""

    def where(self) -> str:
        return socket.gethostname()

    def cast_size(self) -> dict[str, int]:
        from monarch.actor import current_size

        return dict(current_size())


def placements(ctx: fray.JobContext, out: dict[str, Any]) -> None:
    packed = ctx.create_actor_group(Caster, 2, placement="pack")
    out["pack"] = ctx.get(packed.where(), timeout=180)
    ctx.kill(packed)
    spread = ctx.create_actor_group(Caster, 4, placement="spread")
    out["spread"] = ctx.get(spread.where(), timeout=180)
    out["spread_casts"] = ctx.get(spread.cast_size(), timeout=60)
    ctx.kill(spread)
    uneven = ctx.create_actor_group(Caster, 3, placement="spread")
    out["uneven"] = ctx.get(uneven.where(), timeout=180)
    out["uneven_casts"] = ctx.get(uneven.cast_size(), timeout=60)
    ctx.kill(uneven)


class GlooMember:
    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))

    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t[0])

    def world(self) -> tuple[str, str, str, str]:
        names = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
        return (socket.gethostname(), *(os.environ.get(n, "") for n in names))  # type: ignore[return-value]


def checks(ctx: fray.JobContext, big: int, out: dict[str, Any]) -> None:
    out["nodes"] = len(ctx.node_resources())
    out["task_hosts"] = sorted(set(ctx.get([ctx.create_task(hostname) for _ in range(12)], timeout=180)))
    put = ctx.put(np.ones(32 * 2**20, dtype=np.uint8))
    out["put_read"] = sorted(set(ctx.get([ctx.create_task(summed, args=(put,)) for _ in range(6)], timeout=180)))
    del put
    result = ctx.create_task(made, args=(16 * 2**20,))
    value = ctx.get(result, timeout=180)
    out["task_result"] = [int(value.sum()), int(value.nbytes)]
    del value, result
    out["nested"] = ctx.get(ctx.create_task(nested, args=(4,)), timeout=180)
    nodes = ctx.create_actor_group(Node, 2, placement="spread")
    out["actors"] = ctx.get(nodes.where(), timeout=180)
    before = rss()
    start = time.monotonic()
    ref = nodes[0].make(big)
    out["actor_to_actor"] = ctx.get(nodes[1].read(ref), timeout=300)
    out["actor_to_actor_seconds"] = time.monotonic() - start
    out["driver_rss_growth"] = rss() - before
    del ref
    stats = ctx.transfer_stats()
    out["paths"] = {path: [s.count, s.bytes] for path, s in stats.items()}
    ctx.kill(nodes)
    spmd = ctx.create_actor_group(GlooMember, 2, placement="spread", distributed=True)
    out["all_reduce"] = ctx.get(spmd.all_reduce(1.5), timeout=300)
    out["spmd_world"] = ctx.get(spmd.world(), timeout=60)
    ctx.kill(spmd)
    out["timeline"] = timeline_of(ctx)


def timeline_of(ctx: fray.JobContext) -> dict[str, Any]:
    """The job's timeline so far, from every host: what fray.telemetry.timeline.validate says of it (asked again for a
    while, as the conformance suite does: an actor's last events may arrive a moment after its call's result), and the
    hosts where tasks started."""
    from fray.telemetry.timeline import validate

    moved = {path: stats.bytes for path, stats in ctx.transfer_stats().items()}
    with tempfile.TemporaryDirectory() as tmp:
        deadline = time.monotonic() + 20
        while True:
            summary = ctx.timeline(os.path.join(tmp, "trace.json"))
            with open(os.path.join(tmp, "trace.json")) as f:
                problems = validate(json.load(f), transfers=moved)
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    by_process = ctx.events().by_process()
    started = {p.host for p in by_process if any(e.kind == "task.start" for e in p.events)}
    # a value read from another host: its transfer event says where it came from
    sources = {str((e.data or {}).get("from")) for p in by_process for e in p.events if e.name == "tcp-direct"}
    return {"problems": problems, "tasks": summary.tasks, "task_hosts": sorted(started), "tcp_sources": len(sources)}


def main() -> None:
    spec, big = sys.argv[1], int(sys.argv[2])
    out: dict[str, Any] = {"driver": socket.gethostname(), "pid": os.getpid()}
    start = time.monotonic()
    ctx = fray.init(spec)
    out["init_seconds"] = time.monotonic() - start
    checks(ctx, big, out)
    if "placement" in sys.argv[3:]:
        placements(ctx, out)
    print("RESULT " + json.dumps(out), flush=True)
    # What the SIGKILL must not leave behind: a process and a stored value on every host.
    holders = ctx.create_actor_group(Node, 2, placement="spread")
    kept = [holders[i].make(8 * 2**20) for i in range(2)]
    ctx.wait(kept, num_returns=2, timeout=180)
    kept.append(ctx.put(np.ones(8 * 2**20, dtype=np.uint8)))
    print("HOLDING", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
