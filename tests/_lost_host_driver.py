"""Driver for the lost-host tests (tests/monarch/test_lost_host.py, tests/ray/test_ray_lost_node.py), run inside
namespaced host 0: an SPMD group of 2 spread over hosts 1 and 2, with one restart. Prints `BEFORE <json>`, waits
for a line on stdin (the test kills one host meanwhile), then calls the group until it answers again or fails for
good and prints `AFTER <json>`.

    python _lost_host_driver.py SPEC RESOURCES_PER_MEMBER_JSON [task]

`task`: then a task is run instead (the test kills every host: it must fail, not wait).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import fray
from fray import ActorOptions
from fray.errors import ActorUnavailableError


class Rank:
    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")

    def where(self) -> dict[str, Any]:
        names = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES", "FRAY_GPUS")
        env = {k: os.environ.get(k) for k in names}
        return {"host": socket.gethostname(), "pid": os.getpid(), "restarts": fray.current_actor().restarts, **env}

    def reduce(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t[0])


def marked_line(stream: Any, marker: str) -> dict[str, Any] | None:
    """(For the tests.) The JSON of the first line of `stream` that starts with `marker`; None if it ended first."""
    for line in stream:
        if line.startswith(marker + " "):
            found: dict[str, Any] = json.loads(line[len(marker) + 1 :])
            return found
    return None


def main() -> None:
    spec, resources = sys.argv[1], json.loads(sys.argv[2])
    ctx = fray.init(spec)
    options = ActorOptions(max_restarts=1, resources=resources or None)
    group = ctx.create_actor_group(Rank, 2, placement="spread", distributed=True, options=options)
    before = {"where": ctx.get(group.where(), timeout=120), "reduce": ctx.get(group.reduce(), timeout=120)}
    print("BEFORE " + json.dumps(before), flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    if len(sys.argv) > 3 and sys.argv[3] == "task":  # every host lost: a task has nowhere to run
        try:
            ctx.get(ctx.create_task(socket.gethostname), timeout=120)
            print("AFTER " + json.dumps({"error": ""}), flush=True)
        except Exception as exc:
            seconds = round(time.monotonic() - start, 1)
            print("AFTER " + json.dumps({"error": f"{type(exc).__name__}: {exc}", "seconds": seconds}), flush=True)
        fray.shutdown()
        return
    after: dict[str, Any] = {"unavailable": 0}
    while time.monotonic() - start < 180:
        try:
            after.update(where=ctx.get(group.where(), timeout=60), reduce=ctx.get(group.reduce(), timeout=60))
            break
        except ActorUnavailableError:  # restarting
            after["unavailable"] += 1
            time.sleep(0.5)
        except Exception as exc:
            after["error"] = f"{type(exc).__name__}: {exc}"
            break
    after["seconds"] = round(time.monotonic() - start, 1)
    print("AFTER " + json.dumps(after), flush=True)
    fray.shutdown()


if __name__ == "__main__":
    main()
