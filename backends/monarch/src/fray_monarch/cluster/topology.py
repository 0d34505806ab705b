"""A monarch context's topology from its spec options: which hosts (launched or attached, launchers.py), over
which transport (net/network.py), each as a Monarch host mesh, and how each host's object store is set up."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fray.backend import (
    HostGpus,
    byte_count,
    choice,
    flag,
    gpu_view,
    host_gpus,
    host_resources,
    ip_address,
    non_empty_text,
    non_negative,
    parse_resources,
    port,
    positive_int,
    seconds,
)
from fray_monarch.core import tempdirs
from fray_monarch.core.protocol import StoreConfig
from fray_monarch.net import network

if TYPE_CHECKING:
    from fray_monarch.cluster.host_set import HostSet

__all__ = ["SCHEMA", "Topology", "topology"]

ATTACH_TIMEOUT = 60.0  # seconds to wait for every host worker to answer (attach_timeout=)


def _hosts(raw: str) -> list[str] | int:
    """hosts=: worker addresses (tls://h:p,...) or host names (job=ssh), or a count (job=process)."""
    raw = raw.strip()
    if raw.isdigit():
        return positive_int(raw)
    names = [h.strip() for h in raw.split(",") if h.strip()]
    if not names:
        raise ValueError("give host worker addresses (tls://HOST:PORT,...), host names, or a count")
    return names


JOBS = ("local", "ssh", "slurm", "process")


def _job(raw: Any) -> Any:
    """job=: how hosts are launched (a name), or a Monarch job object passed from Python."""
    if isinstance(raw, str) and raw not in JOBS:
        raise ValueError(f"must be one of {', '.join(JOBS)} (or a Monarch job object from Python), got {raw!r}")
    return raw


SCHEMA: dict[str, Callable[[Any], Any]] = {
    "procs": positive_int,
    "cpus": non_negative,
    "gpus": non_negative,
    "gpu_view": gpu_view,
    "resources": parse_resources,
    "hosts": _hosts,
    "object_store_memory": byte_count,
    "memory": byte_count,
    "transport": choice("auto", "tcp", "tls", "rdma"),
    "log_to_driver": flag,
    "job": _job,
    "nodes": positive_int,
    "partition": str,
    "time": str,
    "port": port,
    "python": str,
    "ssh_options": str,
    "bind": ip_address,
    "insecure": flag,
    "attach_timeout": seconds,
    "preempt_wait": seconds,  # job=slurm: how long a preempted allocation's requeued run has to start again
    "mesh": str,
    "address": non_empty_text,  # a recorded head's socket, for fray.cluster (MonarchHeadClient)
    "unguarded_sockets": flag,  # socket_guard.OPT_OUT (a literal: importing fray_monarch must not import
    # socket_guard, or `python -m fray_monarch.socket_guard` warns that runpy found it already imported)
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
    gpus: HostGpus  # this machine's, as each host's (attached hosts are taken to be alike)

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


def topology(opts: dict[str, Any]) -> Topology:
    """The hosts of a context for its spec options, converted by SCHEMA (fray-core converts a spec's options by
    the backend's declared schema before its contexts see them)."""
    from monarch.actor import this_host

    from fray_monarch import socket_guard

    # Monarch's job module loads its telemetry's web and table libraries: the processes of a mesh import this
    # module, and only a driver launches hosts.
    from fray_monarch.cluster.launchers import launch

    unguarded = bool(opts.get(socket_guard.OPT_OUT, False))
    socket_guard.require(unguarded)  # before any Monarch socket exists
    if unguarded:
        socket_guard.warn_unguarded()
    cpus = os.cpu_count() or 1
    gpus = host_gpus(opts.get("gpus"), opts.get("gpu_view", "held"))  # (attached hosts are taken to be alike)
    procs = int(opts.get("procs", len(gpus) or cpus))  # one process per GPU on a GPU host, as Monarch's convention
    # memory: this machine's physical memory by default (attached hosts are taken to be alike; pass memory=),
    # shared out between a host's processes as its CPUs are.
    memory = float(opts.get("memory", host_resources()["memory"]))
    resources = {"CPU": float(opts.get("cpus", cpus)), "memory": memory, **opts.get("resources", {})}
    if len(gpus):
        resources["GPU"] = float(len(gpus))
    budget = int(opts.get("object_store_memory", _default_store_budget()))
    transport = str(opts.get("transport", "auto"))
    if transport == "tls" and opts.get("insecure"):
        raise ValueError(
            "transport=tls encrypts values between hosts with the TLS identities of the control plane, and "
            "insecure=true has none: drop one of the two"
        )
    timeout = float(opts.get("attach_timeout", ATTACH_TIMEOUT))
    hostset = launch(opts, timeout)  # launches hosts if asked (no Monarch runtime needed for that)
    try:
        bind: str | None = opts.get("bind")
        tls_workers = any(network.scheme_of(a) == "tls" for a in hostset.addresses)  # even on this machine
        if not hostset.local or tls_workers:  # other machines take part: TLS or TCP, before Monarch's runtime starts
            here = "127.0.0.1" if hostset.local else network.resolve(socket.gethostname())
            bind = bind or network.route_address(hostset.names) or here
            network.use_network(bind, hostset.secure)
        elif bind is not None:
            network.use_network(bind, not opts.get("insecure", False))  # TLS on loopback too: others reach it
        tempdirs.private_dir()  # starts Monarch's runtime: its socket directory goes in there
        if hostset.job is not None:
            mesh = _job_mesh(hostset.job, opts.get("mesh"))
        elif hostset.addresses:
            mesh = network.attach(hostset.addresses, timeout, bind, hostset.explain)
        else:
            stores = StoreConfig(budget, ("local",), (bind or "127.0.0.1",), bind or "127.0.0.1", transport=transport)
            return Topology([this_host()], procs, resources, None, stores, hostset, gpus)
        count = int(mesh.size("hosts"))
        host_ids = tuple(f"h{i}" for i in range(count))
        # Transfer servers on other machines listen on their address that routes to this driver (""), on this
        # machine where the host worker listens (loopback).
        binds = tuple(hostset.names) if hostset.local and len(hostset.names) == count else ("",) * count
        stores = StoreConfig(budget, host_ids, binds, bind or "127.0.0.1", transport=transport)
        return Topology([mesh.slice(hosts=i) for i in range(count)], procs, resources, mesh, stores, hostset, gpus)
    except BaseException:
        if hostset.release is not None:
            hostset.release()
        raise
