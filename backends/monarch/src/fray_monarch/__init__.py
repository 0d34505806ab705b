"""Fray on PyTorch Monarch: `fray.init("monarch?procs=4")`.

Options: procs (worker processes per host, default CPU count), cpus / gpus (per host, default CPU count / 0),
resources ("name:qty,name:qty" custom resources per host), hosts ("tcp://h:p,tcp://h2:p2": attach to workers
started with `python -m fray_monarch.worker --address tcp://h:p`).
"""

from __future__ import annotations

import os
from typing import Any

from fray.registry import Backend, parse_options, parse_resources
from fray_monarch import _runtime  # noqa: F401 - environment and fault hook before Monarch starts

__all__ = ["MonarchBackend"]


def _hosts(raw: str) -> list[str]:
    return [h.strip() for h in raw.split(",") if h.strip()]


SCHEMA = {"procs": int, "cpus": float, "gpus": float, "resources": parse_resources, "hosts": _hosts}


def _topology(options: dict[str, str]) -> tuple[list[Any], int, dict[str, float], Any]:
    from monarch.actor import attach_to_workers, this_host

    opts = parse_options("monarch", options, SCHEMA)
    cpus = os.cpu_count() or 1
    procs = int(opts.get("procs", cpus))
    if procs < 1:
        raise ValueError("procs must be >= 1")
    resources = {"CPU": float(opts.get("cpus", cpus)), **opts.get("resources", {})}
    if opts.get("gpus"):
        resources["GPU"] = float(opts["gpus"])
    addresses = opts.get("hosts")
    if addresses:
        mesh = attach_to_workers(workers=addresses, ca="trust_all_connections", name="fray_hosts")
        mesh.initialized.get(timeout=60)
        hosts = [mesh.slice(hosts=i) for i in range(len(addresses))]
        return hosts, procs, resources, mesh
    return [this_host()], procs, resources, None


class MonarchBackend(Backend):
    name = "monarch"
    test_spec: str = "monarch?procs=2"

    @property
    def capabilities(self) -> frozenset[Any]:  # type: ignore[override]
        from fray_monarch.cluster import MonarchClusterContext
        from fray_monarch.context import MonarchJobContext

        return MonarchJobContext.capabilities | MonarchClusterContext.capabilities

    def job_context(self, **options: str) -> Any:
        from fray_monarch.context import MonarchJobContext

        hosts, procs, resources, host_mesh = _topology(options)

        def stop_hosts() -> None:
            if host_mesh is not None:
                try:
                    host_mesh.shutdown().get(timeout=10)
                except Exception:
                    pass

        return MonarchJobContext(hosts, procs, resources, on_shutdown=stop_hosts)

    def cluster_context(self, **options: str) -> Any:
        from fray_monarch.cluster import MonarchClusterContext

        hosts, _, _, host_mesh = _topology(options)
        return MonarchClusterContext(hosts, host_mesh)
