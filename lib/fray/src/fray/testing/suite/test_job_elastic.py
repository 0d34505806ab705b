"""Elastic ranks: `create_job(..., replicas=(min, max))` runs as many ranks as the cluster's nodes hold (at least
min, at most max), with torch.distributed's variables set for that world size, and runs the ranks that fit again
after a failed attempt; each attempt's world size is on the record. Each rank asks for half the CPUs of the
largest node, so exactly two fit one node, on a 2-core machine as on a bigger one."""

from __future__ import annotations

from pathlib import Path

import pytest

from fray import Capability, JobStatus
from fray.cluster_context import ClusterContext
from fray.context import JobContext
from fray.errors import InfeasibleResourcesError
from fray.testing import job_workloads as w
from fray.testing import requires_capability

TIMEOUT = 120


def _half_a_node(cluster: ClusterContext) -> tuple[dict[str, float], int]:
    """Each rank's resources (half the largest node's CPUs) and how many ranks the nodes hold, as elastic jobs
    count them: two on one node; over several nodes (where the cluster has them), every node's share."""
    totals = [node["total"] for node in cluster.node_status() if node.get("total", {}).get("CPU")]
    assert totals, f"the {cluster.backend} cluster reports no node with CPUs: {cluster.node_status()}"
    cpu = max(float(total["CPU"]) for total in totals) / 2
    every = sum(int(float(total["CPU"]) / cpu + 1e-9) for total in totals)
    return {"CPU": cpu}, min(8, every)


def _world_sizes(out_dir: Path, attempt: int) -> dict[int, int]:
    """{rank: the WORLD_SIZE it saw} of one attempt."""
    files = out_dir.glob(f"attempt-{attempt}.rank-*")
    return {int(f.name.rsplit("-", 1)[1]): int(f.read_text()) for f in files if not f.name.endswith(".tmp")}


@requires_capability("job_resources")
def test_elastic_job_starts_the_ranks_that_fit(fray_cluster: ClusterContext, tmp_path: Path) -> None:
    each, fit = _half_a_node(fray_cluster)
    job = fray_cluster.create_job(w.note_world_size, args=(str(tmp_path), False), replicas=(1, 8), resources=each)
    info = job.wait(TIMEOUT)
    assert info.status is JobStatus.SUCCEEDED
    assert _world_sizes(tmp_path, 1) == {rank: fit for rank in range(fit)}
    assert [(a.outcome, a.world_size) for a in info.attempts] == [("succeeded", fit)]
    assert info.replicas == fit and info.result == fit
    with pytest.raises(InfeasibleResourcesError, match="min"):  # min ranks could never fit
        fray_cluster.create_job("true", replicas=(fit + 1, fit + 8), resources=each)


@requires_capability("job_resources")
def test_elastic_job_goes_on_with_the_ranks_that_fit_after_a_rank_dies(
    fray_cluster: ClusterContext, tmp_path: Path
) -> None:
    each, fit = _half_a_node(fray_cluster)
    job = fray_cluster.create_job(
        w.note_world_size, args=(str(tmp_path), True), replicas=(1, 8), resources=each, max_retries=1
    )
    info = job.wait(TIMEOUT)
    assert [(a.number, a.outcome, a.world_size) for a in info.attempts] == [(1, "failed", fit), (2, "succeeded", fit)]
    assert "SIGKILL" in info.attempts[0].message
    assert _world_sizes(tmp_path, 1) == _world_sizes(tmp_path, 2) == {rank: fit for rank in range(fit)}
    assert info.result == fit


def test_elastic_replicas_are_checked(fray_cluster: ClusterContext) -> None:
    for bad in ((0, 2), (3, 2), (1, 2, 3), (1.0, 2), (True, 2)):
        with pytest.raises(ValueError, match="min"):
            fray_cluster.create_job("true", replicas=bad)  # type: ignore[arg-type]


def test_elastic_ranks_placed_over_the_nodes_run_as_many_as_fit_each_attempt(
    fray_cluster: ClusterContext, fray_ctx: JobContext, tmp_path: Path
) -> None:
    # placement: each attempt's ranks are a group of the job's own fray context, which counts them against its nodes
    # then; a hundredth of a CPU each, so its max of three fits any node. It needs job_resources of the backend's
    # clusters and spmd_groups of its job contexts (requires_capability would ask the job context for both).
    if Capability.JOB_RESOURCES not in fray_cluster.capabilities:
        pytest.skip(f"backend {fray_ctx.backend!r} lacks capability 'job_resources'")
    if Capability.SPMD_GROUPS not in fray_ctx.capabilities:
        pytest.skip(f"backend {fray_ctx.backend!r} lacks capability 'spmd_groups': ranks over nodes are a group")
    job = fray_cluster.create_job(
        w.note_world_size,
        args=(str(tmp_path), True),
        replicas=(2, 3),
        resources={"CPU": 0.01},
        placement="pack",
        max_retries=1,
    )
    info = job.wait(TIMEOUT)
    assert [(a.outcome, a.world_size) for a in info.attempts] == [("failed", 3), ("succeeded", 3)], info
    assert _world_sizes(tmp_path, 2) == {rank: 3 for rank in range(3)}
