"""Fray on PyTorch Monarch: `fray.init("monarch?procs=4")`.

Options: procs (worker processes per host, default CPU count), cpus / gpus (per host, default CPU count / 0),
resources ("name:qty,name:qty" custom resources per host), hosts ("tcp://h:p,tcp://h2:p2": attach to workers
started with `python -m fray_monarch.worker --address tcp://h:p`), log_to_driver (true|false, default true: what
tasks and actors print reaches the driver's console as `(square pid=4242) ...`).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from fray.jobs import host_resources
from fray.registry import Backend, non_negative, parse_options, parse_resources, positive_int
from fray_monarch import _runtime  # environment and fault hook before Monarch starts
from fray_monarch.protocol import StoreConfig

__all__ = ["MonarchBackend"]


def _hosts(raw: str) -> list[str]:
    return [h.strip() for h in raw.split(",") if h.strip()]


def _bytes(raw: str) -> int:
    value = int(float(raw))
    if value <= 0:
        raise ValueError(f"must be a positive number of bytes, got {raw!r}")
    return value


def _transport(raw: str) -> str:
    if raw not in ("auto", "tcp", "rdma"):
        raise ValueError(f"must be auto, tcp or rdma, got {raw!r}")
    return raw


def _flag(raw: str) -> bool:
    if raw.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"must be true or false, got {raw!r}")
    return raw.lower() in ("true", "1")


SCHEMA = {
    "procs": positive_int,
    "cpus": non_negative,
    "gpus": non_negative,
    "resources": parse_resources,
    "hosts": _hosts,
    "object_store_memory": _bytes,
    "memory": _bytes,
    "transport": _transport,
    "log_to_driver": _flag,
}


def _default_store_budget() -> int:
    """30% of the host's memory, as Ray's object store default."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.3)


def _tcp_host(address: str) -> str:
    return address[len("tcp://") :].rsplit(":", 1)[0].strip("[]")


def _driver_bind(hosts: list[str]) -> str:
    """Where the driver's transfer server listens: loopback unless a worker host is elsewhere, then the local
    address that routes to it (never every interface)."""
    remote = [h for h in hosts if not h.startswith("127.") and h not in ("localhost", "::1")]
    if not remote:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((remote[0], 9))
        return str(probe.getsockname()[0])


def _topology(options: dict[str, str]) -> tuple[list[Any], int, dict[str, float], Any, StoreConfig]:
    from monarch.actor import attach_to_workers, this_host

    opts = parse_options("monarch", options, SCHEMA)
    _runtime.private_dir()  # before Monarch's runtime starts: its socket directory goes in there
    cpus = os.cpu_count() or 1
    procs = int(opts.get("procs", cpus))
    # memory: this machine's physical memory by default (attached hosts are taken to be alike; pass memory=),
    # shared out between a host's processes as its CPUs are.
    memory = float(opts.get("memory", host_resources()["memory"]))
    resources = {"CPU": float(opts.get("cpus", cpus)), "memory": memory, **opts.get("resources", {})}
    if opts.get("gpus"):
        resources["GPU"] = float(opts["gpus"])
    budget = int(opts.get("object_store_memory", _default_store_budget()))
    transport = str(opts.get("transport", "auto"))
    addresses = opts.get("hosts")
    if addresses:
        binds = tuple(_tcp_host(a) for a in addresses)
        host_ids = tuple(f"h{i}" for i in range(len(addresses)))
        stores = StoreConfig(budget, host_ids, binds, _driver_bind(list(binds)), transport=transport)
        mesh = attach_to_workers(workers=addresses, ca="trust_all_connections", name="fray_hosts")
        mesh.initialized.get(timeout=60)
        hosts = [mesh.slice(hosts=i) for i in range(len(addresses))]
        return hosts, procs, resources, mesh, stores
    return [this_host()], procs, resources, None, StoreConfig(budget, ("local",), ("127.0.0.1",), transport=transport)


class MonarchBackend(Backend):
    name = "monarch"
    test_spec: str = "monarch?procs=2&cpus=4"  # 4 CPUs like the other backends' test specs, on 2 processes

    @property
    def capabilities(self) -> frozenset[Any]:  # type: ignore[override]
        from fray_monarch.cluster import MonarchClusterContext
        from fray_monarch.context import MonarchJobContext

        return MonarchJobContext.capabilities | MonarchClusterContext.capabilities

    def diagnose(self) -> dict[str, str]:
        """RDMA state, RDMA devices (pyverbs) and a short RDMABuffer probe, for `fray doctor`."""
        from fray_monarch.diagnostics import diagnose

        return diagnose()

    def job_context(self, **options: str) -> Any:
        from fray_monarch.context import MonarchJobContext

        hosts, procs, resources, host_mesh, stores = _topology(options)
        log_to_driver = parse_options("monarch", options, SCHEMA).get("log_to_driver", True)

        def stop_hosts() -> None:
            if host_mesh is not None:
                try:
                    host_mesh.shutdown().get(timeout=10)
                except Exception:
                    pass

        return MonarchJobContext(
            hosts, procs, resources, stores, on_shutdown=stop_hosts, host_mesh=host_mesh, log_to_driver=log_to_driver
        )

    def cluster_context(self, **options: str) -> Any:
        from fray_monarch.cluster import MonarchClusterContext

        hosts, _, _, host_mesh, _ = _topology(options)
        return MonarchClusterContext(hosts, host_mesh)
