"""Fray on PyTorch Monarch: `fray.init("monarch?procs=4")`.

Options: procs (worker processes per host, default one per GPU on a GPU host, else the CPU count), cpus / gpus (per
host, default CPU count / the GPUs found here),
resources ("name:qty,name:qty" custom resources per host), hosts ("tls://h:p,tls://h2:p2": attach to workers
started with `python -m fray_monarch.worker --address tls://h:p`; with job=ssh host names, with job=process a
count), insecure (true: plain TCP between machines instead of TLS), job (ssh|slurm|process|local, or a Monarch
job object: hosts launched through Monarch's job API, see cluster/job_launch.py), nodes / partition / time (job=slurm),
port / python / ssh_options (launched host workers), bind (this machine's address the driver listens on when
other machines take part), attach_timeout (seconds), log_to_driver (true|false, default true: what tasks and
actors print reaches the driver's console as `(square pid=4242) ...`), unguarded_sockets (true: run in a driver
started without fray's socket guard, see socket_guard.py). Full table: docs/backends/monarch.md.
"""

from __future__ import annotations

from typing import Any

from fray.backend import Backend, Capability, choose_recording
from fray_monarch.core import runtime  # noqa: F401 - environment and fault hook before Monarch starts

# isort: split
from fray_monarch.cluster.topology import SCHEMA, topology

__all__ = ["MonarchBackend"]


class MonarchBackend(Backend):
    name = "monarch"
    test_spec = "monarch?procs=2&cpus=4"  # 4 CPUs like the other backends' test specs, on 2 processes
    options = SCHEMA

    @property
    def capabilities(self) -> frozenset[Capability]:
        from fray_monarch.cluster.context import MonarchClusterContext
        from fray_monarch.cluster.head_client import MonarchHeadClient
        from fray_monarch.core.context import MonarchJobContext

        return MonarchJobContext.capabilities | MonarchClusterContext.capabilities | MonarchHeadClient.capabilities

    def diagnose(self) -> dict[str, str]:
        """RDMA state, RDMA devices (pyverbs) and a short RDMABuffer probe, for `fray doctor`."""
        from fray_monarch.diagnostics import diagnose

        return diagnose()

    def prepare_command(self, options: Any) -> None:
        """The `fray` command starts again under the socket guard (socket_guard.py) before a monarch context."""
        import sys

        from fray_monarch import socket_guard

        if not socket_guard.active() and not options.get(socket_guard.OPT_OUT):
            socket_guard.restart_under_guard([sys.executable, *sys.orig_argv[1:]])

    def job_context(self, **options: Any) -> Any:
        from fray_monarch.driver.client import driver_context

        if "address" in options:
            raise ValueError(
                "option address= (the socket of a head `fray cluster start` recorded) is for fray.cluster and the "
                "`fray job` commands; a JobContext attaches to host workers with hosts=ADDRESS,..."
            )
        log_to_driver = options.get("log_to_driver", True)
        top = topology(options)
        recording = choose_recording(True)
        try:
            return driver_context(
                top.hosts,
                top.procs,
                top.resources,
                top.stores,
                on_shutdown=top.release,
                host_mesh=top.host_mesh,
                log_to_driver=log_to_driver,
                host_addresses=top.hostset.addresses,
                gpus=top.gpus,
                recording=recording,
            )
        except BaseException:
            recording.release()
            top.release()
            raise

    def cluster_context(self, **options: Any) -> Any:
        """A cluster context of its own hosts, or with address= (the socket `fray cluster start` recorded) a
        client of that cluster's head, whose jobs outlive this process."""
        from fray_monarch.cluster.context import MonarchClusterContext, job_spec
        from fray_monarch.cluster.job_recovery import PREEMPT_WAIT

        if "address" in options:
            from fray_monarch.cluster.head_client import MonarchHeadClient

            return MonarchHeadClient(str(options.pop("address")))
        top = topology(options)
        try:
            remote = top.host_mesh is not None
            jobs_reach = job_spec(options, top.hostset)
            return MonarchClusterContext(
                top.hosts,
                top.stores.driver_bind,
                top.release,
                remote,
                top.hostset,
                jobs_reach,
                float(options.get("preempt_wait", PREEMPT_WAIT)),
                lambda hostset: job_spec(options, hostset),
            )
        except BaseException:
            top.release()
            raise

    def persistent_address(self) -> tuple[str | None, str]:
        """Where `fray job ...` finds jobs: the head `fray cluster start --backend monarch` recorded, if it runs.
        (its socket or None, why there is none)."""
        from fray_monarch.cluster.head_record import recorded

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
        from fray_monarch.cluster.persistent import start

        return start(listen, options)

    def stop_cluster(self) -> dict[str, Any] | None:
        """`fray cluster stop`: end the recorded head, its jobs and the hosts it launched."""
        from fray_monarch.cluster.persistent import stop

        return stop()
