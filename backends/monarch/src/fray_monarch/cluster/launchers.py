"""Where a monarch context's hosts come from, and who ends them.

- this machine (the default, or `job=local`);
- host workers the user started (`hosts=tls://h:p,...`): attached to, never ended by fray (like Ray's worker
  nodes, they are the user's); the processes fray starts on them end with the context;
- hosts launched through Monarch's own job API: `job=ssh&hosts=h2,h3` (SSHJob), `job=slurm&nodes=2` (SlurmJob),
  `job=process&hosts=2` (ProcessJob, one machine), or any Monarch job object (`fray.init("monarch", job=job)`);
  a context that launched its hosts ends them at shutdown and when its process ends however it ends;
- the hosts `fray cluster start --backend monarch` recorded, while its head runs (`fray.init("monarch")` with
  neither hosts= nor job=; `job=local` keeps to this machine).

Launching needs no Monarch runtime; attaching does, and it must come after the transport is chosen (net/network.py).
Hosts on other machines talk TLS (net/tls.py) unless the spec says `insecure=true`: plain TCP lets anyone who can
reach a worker's port run code as its user, so fray asks for that acknowledgement before using it.
"""

from __future__ import annotations

from typing import Any

from fray_monarch.cluster.host_set import HostSet
from fray_monarch.net.network import host_of, is_loopback, scheme_of

__all__ = ["launch"]


def _recorded() -> HostSet | None:
    """The hosts of the cluster `fray cluster start --backend monarch` recorded, if its head runs (it holds
    them: this context ends only what it starts there)."""
    from fray_monarch.cluster.head_record import recorded

    record = recorded()
    if record is None or not record["running"] or not record.get("hosts"):
        return None
    holder = f"the cluster `fray cluster start` started (pid {record['pid']}, {record.get('holder')})"
    hosts = list(record["hosts"])
    secure = any(scheme_of(a) == "tls" for a in hosts)
    return HostSet(hosts, list(record["names"]), holder, None, local=bool(record.get("local")), secure=secure)


def _started_by_user(hosts: Any, insecure: bool) -> HostSet:
    """Host workers the user started: all over TLS, or all over TCP (to another machine: only with insecure); or
    a cluster's workers on this machine by their Monarch address (`id@ipc://...`: what the jobs of a job=process
    cluster get, cluster.job_spec)."""
    if not isinstance(hosts, list) or not all(scheme_of(h) in ("tls", "tcp", "ipc") and "://" in h for h in hosts):
        raise ValueError(
            "hosts= takes the addresses of host workers you started (tls://HOST:PORT,...); to launch hosts, "
            "add job=ssh (host names), job=slurm (nodes=N) or job=process (hosts=N)"
        )
    schemes = {scheme_of(a) for a in hosts}
    if len(schemes) > 1:
        raise ValueError("hosts= mixes tls:// and tcp:// workers: a context talks one of them to all its hosts")
    if schemes == {"ipc"}:  # Unix sockets: this machine
        return HostSet(list(hosts), [f"process {i}" for i in range(len(hosts))], "started by you", None)
    names = [host_of(a)[0] for a in hosts]
    local = all(is_loopback(n) for n in names)
    if schemes == {"tcp"} and not insecure:
        where = "this machine's loopback, which every local user reaches" if local else "another machine"
        raise ValueError(
            f"plain TCP to {where} ({', '.join(hosts)}) is unauthenticated: anyone who can reach that port (or "
            "this driver's) can run code as its user and read every value sent. Use tls:// workers "
            "(`python -m fray_monarch.worker --address tls://HOST:PORT`, with this user's TLS authority there), "
            "or add insecure=true to accept that on a network and machine you trust"
        )
    return HostSet(list(hosts), names, "started by you", None, local=local, secure=schemes == {"tls"})


def launch(opts: dict[str, Any], timeout: float) -> HostSet:
    """The hosts the spec asks for, launched if it asks for that (no Monarch runtime is started here)."""
    job = opts.get("job")
    hosts = opts.get("hosts")
    if job is None and not hosts:
        return _recorded() or HostSet()
    if job is None or job == "local":
        if job == "local" and hosts:
            raise ValueError("job=local runs on this machine only: it takes no hosts=")
        if not hosts:
            return HostSet()
        return _started_by_user(hosts, bool(opts.get("insecure", False)))
    from fray_monarch.cluster import job_launch  # (Monarch's job module: only where Monarch launches the hosts)

    if job == "ssh":
        return job_launch.ssh_hosts(opts)
    if job == "slurm":
        return job_launch.slurm_hosts(opts, timeout)
    if job == "process":
        return job_launch.process_hosts(opts)
    return job_launch.job_object_hosts(job)
