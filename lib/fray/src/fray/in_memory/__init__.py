"""The in_memory backend: threads in this process, no server, starts in milliseconds.

Spec options: cpus, gpus (default: the GPUs found here, fray.runtime.gpus; on a machine without any, gpus=N declares N),
gpu_view (held|host; default held: what a process started for work holding GPUs sees, fray.runtime.gpus.GPU_VIEWS),
memory (bytes), resources (JSON object of custom resources, e.g. {"disk": 4}),
serialize (true|false; default true: values are pickled as on a cluster), namespace (for named/detached actors),
log_to_driver (true|false; default true: lines printed in tasks and actors are prefixed with who printed them),
events (true|false; default false, or FRAY_EVENTS: record events for ctx.timeline() and the live page;
fray.telemetry.events), and for the cluster context: root (directory for job logs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from fray.backend import (
    Backend,
    Capability,
    flag,
    gpu_view,
    host_gpus,
    host_resources,
    huge_pages_in_this_process,
    non_negative,
    parse_resources,
)
from fray.in_memory.cluster import InMemoryClusterContext
from fray.in_memory.job import InMemoryJobContext

__all__ = ["InMemoryBackend", "InMemoryClusterContext", "InMemoryJobContext"]


class InMemoryBackend(Backend):
    name = "in_memory"
    test_spec = "in_memory?cpus=4&events=on"
    # One spec (e.g. FRAY_BACKEND) serves fray.init and fray.cluster, so both accept every option.
    options: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "cpus": non_negative,
        "gpus": non_negative,
        "gpu_view": gpu_view,
        "memory": non_negative,
        "resources": parse_resources,
        "serialize": flag,
        "namespace": str,
        "root": str,
        "log_to_driver": flag,
        "events": flag,
    }

    @property
    def capabilities(self) -> frozenset[Capability]:
        return InMemoryJobContext.capabilities | InMemoryClusterContext.capabilities

    def job_context(self, **opts: Any) -> InMemoryJobContext:
        host = host_resources()
        gpus = host_gpus(opts.get("gpus"), opts.get("gpu_view", "held"))
        totals = {
            "CPU": opts.get("cpus", host["CPU"]),
            "GPU": float(len(gpus)),
            "memory": opts.get("memory", host["memory"]),
            **opts.get("resources", {}),
        }
        huge_pages_in_this_process()  # its tasks and actors are threads of this process (fray.runtime.worker_env)
        return InMemoryJobContext(
            totals,
            serialize=opts.get("serialize", True),
            namespace=opts.get("namespace", "default"),
            log_to_driver=opts.get("log_to_driver", True),
            gpus=gpus,
            events=opts.get("events"),
        )

    def cluster_context(self, **opts: Any) -> InMemoryClusterContext:
        gpus = host_gpus(opts.get("gpus"), opts.get("gpu_view", "held"))
        return InMemoryClusterContext(opts.get("root"), gpus=gpus)
