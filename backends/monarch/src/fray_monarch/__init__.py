"""Fray on PyTorch Monarch: `fray.init("monarch?procs=4")`.

Options: procs (worker processes per host, default CPU count), cpus / gpus (per host, default CPU count / 0),
resources ("name:qty,name:qty" custom resources per host), hosts ("tcp://h:p,tcp://h2:p2": attach to workers
started with `python -m fray_monarch.worker --address tcp://h:p`; with job=ssh host names, with job=process a
count), job (ssh|slurm|process|local, or a Monarch job object: hosts launched through Monarch's job API, see
launchers.py), nodes / partition / time (job=slurm), port / python / ssh_options (launched host workers), bind
(this machine's address the driver listens on when other machines take part), attach_timeout (seconds),
log_to_driver (true|false, default true: what tasks and actors print reaches the driver's console as
`(square pid=4242) ...`). Full table: docs/backends/monarch.md.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fray.jobs import host_resources
from fray.registry import Backend, non_negative, parse_options, parse_resources, positive_int
from fray_monarch import (
    _runtime,  # environment and fault hook before Monarch starts
    network,
)
from fray_monarch.launchers import HostSet, launch
from fray_monarch.protocol import StoreConfig

__all__ = ["MonarchBackend"]

ATTACH_TIMEOUT = 60.0  # seconds to wait for every host worker to answer (attach_timeout=)


def _hosts(raw: str) -> list[str] | int:
    """hosts=: worker addresses (tcp://h:p,...) or host names (job=ssh), or a count (job=process)."""
    raw = raw.strip()
    if raw.isdigit():
        return positive_int(raw)
    names = [h.strip() for h in raw.split(",") if h.strip()]
    if not names:
        raise ValueError("give host worker addresses (tcp://HOST:PORT,...), host names, or a count")
    return names


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


JOBS = ("local", "ssh", "slurm", "process")


def _job(raw: Any) -> Any:
    """job=: how hosts are launched (a name), or a Monarch job object passed from Python."""
    if isinstance(raw, str) and raw not in JOBS:
        raise ValueError(f"must be one of {', '.join(JOBS)} (or a Monarch job object from Python), got {raw!r}")
    return raw


def _address(raw: str) -> str:
    try:
        return str(ipaddress.ip_address(raw.strip("[]")))
    except ValueError:
        raise ValueError(f"must be an IP address of this machine, got {raw!r}") from None


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 < value < 65536:
        raise ValueError(f"must be a TCP port (1-65535), got {raw!r}")
    return value


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError(f"must be a number of seconds > 0, got {raw!r}")
    return value


SCHEMA: dict[str, Callable[[Any], Any]] = {
    "procs": positive_int,
    "cpus": non_negative,
    "gpus": non_negative,
    "resources": parse_resources,
    "hosts": _hosts,
    "object_store_memory": _bytes,
    "memory": _bytes,
    "transport": _transport,
    "log_to_driver": _flag,
    "job": _job,
    "nodes": positive_int,
    "partition": str,
    "time": str,
    "port": _port,
    "python": str,
    "ssh_options": str,
    "bind": _address,
    "attach_timeout": _seconds,
    "mesh": str,
}


def _default_store_budget() -> int:
    """30% of the host's memory, as Ray's object store default."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.3)


@dataclass
class Topology:
    """The hosts of one context, attached: one Monarch host mesh per fray host."""

    hosts: list[Any]
    procs: int
    resources: dict[str, float]
    host_mesh: Any  # all hosts as one mesh (None: this machine only)
    stores: StoreConfig
    hostset: HostSet

    def release(self) -> None:
        """End the hosts this context launched (hosts the user started stay, like Ray's worker nodes)."""
        if self.hostset.release is not None:
            self.hostset.release()


def _job_mesh(job: Any, name: str | None) -> Any:
    meshes = dict(job.state(cached_path=None)._hosts)
    if name is None and len(meshes) == 1:
        return next(iter(meshes.values()))
    if name in meshes:
        return meshes[name]
    raise ValueError(f"this Monarch job has host meshes {sorted(meshes)}: name the one to use with mesh=")


def _topology(options: dict[str, Any]) -> Topology:
    from monarch.actor import this_host

    opts = parse_options("monarch", options, SCHEMA)
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
    timeout = float(opts.get("attach_timeout", ATTACH_TIMEOUT))
    hostset = launch(opts, timeout)  # launches hosts if asked (no Monarch runtime needed for that)
    try:
        bind: str | None = opts.get("bind")
        if not hostset.local:  # other machines take part: TCP, before anything starts Monarch's runtime
            bind = bind or network.route_address(hostset.names) or network.resolve(socket.gethostname())
            network.use_tcp(bind)
        elif bind is not None:
            network.use_tcp(bind)
        _runtime.private_dir()  # starts Monarch's runtime: its socket directory goes in there
        if hostset.job is not None:
            mesh = _job_mesh(hostset.job, opts.get("mesh"))
        elif hostset.addresses:
            mesh = network.attach(hostset.addresses, timeout, bind, hostset.explain)
        else:
            stores = StoreConfig(budget, ("local",), (bind or "127.0.0.1",), bind or "127.0.0.1", transport=transport)
            return Topology([this_host()], procs, resources, None, stores, hostset)
        count = int(mesh.size("hosts"))
        host_ids = tuple(f"h{i}" for i in range(count))
        # Transfer servers on other machines listen on their address that routes to this driver (""), on this
        # machine where the host worker listens (loopback).
        binds = tuple(hostset.names) if hostset.local and len(hostset.names) == count else ("",) * count
        stores = StoreConfig(budget, host_ids, binds, bind or "127.0.0.1", transport=transport)
        return Topology([mesh.slice(hosts=i) for i in range(count)], procs, resources, mesh, stores, hostset)
    except BaseException:
        if hostset.release is not None:
            hostset.release()
        raise


class MonarchBackend(Backend):
    name = "monarch"
    test_spec: str = "monarch?procs=2&cpus=4"  # 4 CPUs like the other backends' test specs, on 2 processes

    @property
    def capabilities(self) -> frozenset[Any]:  # type: ignore[override]
        from fray_monarch.cluster import MonarchClusterContext
        from fray_monarch.context import MonarchJobContext
        from fray_monarch.head_client import MonarchHeadClient

        return MonarchJobContext.capabilities | MonarchClusterContext.capabilities | MonarchHeadClient.capabilities

    def diagnose(self) -> dict[str, str]:
        """RDMA state, RDMA devices (pyverbs) and a short RDMABuffer probe, for `fray doctor`."""
        from fray_monarch.diagnostics import diagnose

        return diagnose()

    def job_context(self, **options: Any) -> Any:
        from fray_monarch.context import MonarchJobContext

        log_to_driver = parse_options("monarch", options, SCHEMA).get("log_to_driver", True)
        top = _topology(options)
        try:
            return MonarchJobContext(
                top.hosts,
                top.procs,
                top.resources,
                top.stores,
                on_shutdown=top.release,
                host_mesh=top.host_mesh,
                log_to_driver=log_to_driver,
            )
        except BaseException:
            top.release()
            raise

    def cluster_context(self, **options: Any) -> Any:
        """A cluster context of its own hosts, or with address= (the socket `fray cluster start` recorded) a
        client of that cluster's head, whose jobs outlive this process."""
        from fray_monarch.cluster import MonarchClusterContext

        if "address" in options:
            from fray_monarch.head_client import MonarchHeadClient

            return MonarchHeadClient(str(options.pop("address")))
        top = _topology(options)
        try:
            remote = top.host_mesh is not None
            return MonarchClusterContext(top.hosts, top.stores.driver_bind, top.release, remote, top.hostset)
        except BaseException:
            top.release()
            raise

    def persistent_address(self) -> tuple[str | None, str]:
        """Where `fray job ...` finds jobs: the head `fray cluster start --backend monarch` recorded, if it runs.
        (its socket or None, why there is none)."""
        from fray_monarch.head import recorded

        record = recorded()
        if record is not None and record["running"]:
            return str(record["socket"]), ""
        start = "`fray cluster start --backend monarch --job ssh --hosts h2,h3` (or --job slurm --nodes N)"
        if record is not None:
            return (
                None,
                f"The monarch cluster recorded in the state directory (pid {record.get('pid')}) is not "
                f"running any more: {start} starts a new one.",
            )
        return None, f"Start one with {start}; `fray cluster stop --backend monarch` stops it."

    def start_cluster(self, listen: str, **options: Any) -> tuple[dict[str, Any], bool]:
        """`fray cluster start`: a head process that launches the spec's hosts and outlives the command."""
        from fray_monarch.persistent import start

        return start(listen, options)

    def stop_cluster(self) -> dict[str, Any] | None:
        """`fray cluster stop`: end the recorded head, its jobs and the hosts it launched."""
        from fray_monarch.persistent import stop

        return stop()
