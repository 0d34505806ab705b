"""`fray cluster start|stop` and `fray status`."""

from __future__ import annotations

import argparse
import json

from fray.backend import PersistentClusters
from fray.cli.common import as_dict, lacks_persistence, open_cluster, resolve, say
from fray.host.state_dir import state_dir
from fray.registry import backend_options
from fray.runtime.capabilities import Capability
from fray.runtime.resources import format_amount

_LAUNCH_FLAGS = ("job", "hosts", "nodes", "partition", "time")


def cluster_start(args: argparse.Namespace) -> int:
    name, options, backend = resolve(args)
    options.update({flag: getattr(args, flag) for flag in _LAUNCH_FLAGS if getattr(args, flag, None) is not None})
    if not isinstance(backend, PersistentClusters):
        if Capability.PERSISTENT_JOBS in backend.capabilities:
            say(f"the {name} backend needs no cluster: its jobs run on this machine (detached ones: {state_dir()})")
            return 0
        raise lacks_persistence(name, "fray cluster start")
    record, started = backend.start_cluster(args.listen, **backend_options(backend, options))
    if not started:
        say(f"a {name} cluster is running already (pid {record['pid']}): {record['address']}")
        return 0
    print(record["address"])
    say(
        f"started a {name} cluster (pid {record['pid']}) at {record['address']}, recorded in {state_dir()}; "
        f"`fray job submit --backend {name} -- CMD` uses it, `fray cluster stop --backend {name}` stops it"
    )
    for line in record.get("notes", ()):
        say(line)
    return 0


def cluster_stop(args: argparse.Namespace) -> int:
    name, _, backend = resolve(args)
    if not isinstance(backend, PersistentClusters):
        say(f"the {name} backend has no cluster to stop")
        return 0
    record = backend.stop_cluster()
    if record is None:
        say(f"no {name} cluster is recorded in {state_dir()}: nothing to stop")
    elif not record.get("running"):
        say(f"the recorded {name} cluster (pid {record.get('pid')}) was not running; its record is removed")
    else:
        say(f"stopped the {name} cluster at {record['address']}")
    return 0


def status(args: argparse.Namespace) -> int:
    with open_cluster(args, "fray status") as ctx:
        nodes = ctx.node_status()
        jobs = ctx.list_jobs()
        work = ctx.running_work()
        where = {"backend": ctx.backend, **ctx.describe()}
    if args.json:
        seen = {"nodes": nodes, "jobs": [as_dict(info) for info in jobs], **(work or {})}
        print(json.dumps({**where, **seen}, indent=1))
        return 0
    print("  ".join(f"{key}: {value}" for key, value in where.items() if key != "address"))
    print(f"nodes: {len(nodes)}")
    for node in nodes:
        total, free = node.get("total", {}), node.get("free", {})
        parts = [
            f"{key} {format_amount(key, free[key])} free of {format_amount(key, qty)}"
            if key in free
            else f"{key} {format_amount(key, qty)}"
            for key, qty in sorted(total.items())
        ]
        seen_at = [
            f"{key.replace('_', ' ')} {node[key]}" for key in ("address", "processes", "held_by") if node.get(key)
        ]
        print(f"  {node.get('node')}: " + ", ".join(parts) + ("  (" + ", ".join(seen_at) + ")" if seen_at else ""))
    if work is not None:
        for kind in ("tasks", "actors"):
            items = work.get(kind, [])
            print(f"{kind}: {len(items)} {'running' if kind == 'tasks' else 'alive'}")
            names: dict[str, int] = {}
            for item in items:
                label = str(item.get("class") or item.get("name") or "?")
                names[label] = names.get(label, 0) + 1
            for label, n in sorted(names.items(), key=lambda kv: -kv[1])[:10]:
                print(f"  {label} x{n}")
    counts: dict[str, int] = {}
    for info in jobs:
        counts[info.status.value] = counts.get(info.status.value, 0) + 1
    print(
        f"jobs: {len(jobs)}" + (" (" + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ")" if jobs else "")
    )
    for info in jobs:
        if not info.status.is_terminal:
            print(f"  {info.id}  {info.status.value}  {info.entrypoint[:60]}")
    return 0
