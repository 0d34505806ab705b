"""The in_memory ClusterContext: each job is a subprocess of this machine (fray.kit.cluster)."""

from __future__ import annotations

from fray.kit import LocalClusterContext

__all__ = ["InMemoryClusterContext"]


class InMemoryClusterContext(LocalClusterContext):
    backend = "in_memory"
