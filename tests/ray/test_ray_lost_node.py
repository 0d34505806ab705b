"""A Ray node lost under an SPMD group (issue 19), on namespaced hosts: a Ray head on host 0 (where the driver
runs) and a worker node on each of hosts 1 and 2; a group of 2 spread over the two worker nodes (one rank each,
by a custom resource only they have), one restart. Every process of rank 0's host is SIGKILLed (the node is
lost); Ray places rank 0's bundle again on the node left, and fray restarts the group there: both ranks on
fresh processes on host 2, MASTER_ADDR moved to its loopback (every member is there), `restarts == 1`, the
collective answering again. The module's cases share one cluster: each starts again the worker node an earlier
case lost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fray_ray")

from _lost_host_driver import marked_line
from _lost_rank_job_driver import assert_lost_then_succeeded
from _netns import Host, namespaced_hosts, require_namespaced_hosts
from _ray_hosts import (
    DASHBOARD_PORT,
    PORT,
    RayNode,
    cluster_env,
    log_tails,
    restart_lost_workers,
    running_cluster,
    stop_nodes,
)

DRIVER = Path(__file__).resolve().parent.parent / "_lost_host_driver.py"
JOB_DRIVER = DRIVER.with_name("_lost_rank_job_driver.py")
CLUSTER_WAIT = 180.0
# The GCS declares a node dead after health_check_failure_threshold failed checks health_check_period_ms apart
# (Ray's defaults 5 and 3000: ~15 s of this test's wait). A check only fails when the raylet does not answer within
# health_check_timeout_ms (10 s, unchanged), so a live node is never taken for dead; a killed one refuses at once.
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
WORKERS = {"member_slot": 2.0}  # each worker node's resources: room for the two ranks of every case
pytestmark = pytest.mark.timeout(CLUSTER_WAIT + 420)
Cluster = tuple[list[Host], list[RayNode], Path, dict[str, str]]  # the cluster fixture's: hosts, nodes, dir, env


@dataclass
class _SharedCluster:
    hosts: list[Host]
    nodes: list[RayNode]  # the head's first; a lost worker's is replaced by the one started again
    base: Path
    env: dict[str, str]
    started_again: list[RayNode] = field(default_factory=list)
    cases: int = 0


def _line(stream: Any, marker: str, err: Path, nodes: list[RayNode]) -> dict[str, Any]:
    found = marked_line(stream, marker)
    assert found is not None, f"no {marker}: {err.read_text(errors='replace')[-3000:]}\n{log_tails(nodes)}"
    return found


@pytest.fixture(scope="module")
def shared_cluster() -> Iterator[_SharedCluster]:
    """The module's nodes; the head serves Ray's job API (the job cases' drivers submit there)."""
    require_namespaced_hosts()
    base = Path(tempfile.mkdtemp(prefix="fray-ln-", dir="/tmp"))  # short: Ray's socket paths are under it
    try:
        with namespaced_hosts(3) as hosts:
            env = {**cluster_env(base), **FAST_NODE_DEATH}
            with running_cluster(hosts, base, env, WORKERS, CLUSTER_WAIT, dashboard=True) as (nodes, _):
                shared = _SharedCluster(hosts, nodes, base, env)
                try:
                    yield shared
                finally:
                    stop_nodes(shared.started_again)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def cluster(shared_cluster: _SharedCluster) -> Cluster:
    """The shared cluster with a live node on every worker host, and a directory of this case's own."""
    shared = shared_cluster
    started = restart_lost_workers(shared.nodes, shared.base, shared.env, WORKERS, CLUSTER_WAIT)
    shared.started_again += started
    shared.cases += 1
    case = shared.base / f"case-{shared.cases}"
    case.mkdir()
    return shared.hosts, shared.nodes, case, shared.env


def test_a_group_on_a_lost_node_comes_back_on_the_node_left(cluster: Cluster) -> None:
    hosts, nodes, base, env = cluster
    err = base / "driver.err"
    spec = f"ray?address={hosts[0].address}:{PORT}&log_to_driver=false"
    with open(err, "w") as errors:
        driver = hosts[0].popen(
            [sys.executable, str(DRIVER), spec, json.dumps({"member_slot": 1})],
            cwd=str(base),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    assert driver.stdin is not None and driver.stdout is not None
    try:
        before = _line(driver.stdout, "BEFORE", err, nodes)
        workers = {hosts[1].name, hosts[2].name}
        assert {w["host"] for w in before["where"]} == workers and before["reduce"] == [2.0, 2.0], before
        lost = next(h for h in hosts if h.name == before["where"][0]["host"])  # rank 0's: the rendezvous moves
        left = next(h for h in hosts[1:] if h is not lost)
        lost.kill_all()  # the machine is gone: its raylet, its workers, everything
        driver.stdin.write("go\n")
        driver.stdin.flush()
        after = _line(driver.stdout, "AFTER", err, nodes)
        driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert "error" not in after, after
    ranks = after["where"]
    assert after["reduce"] == [2.0, 2.0] and [r["host"] for r in ranks] == [left.name, left.name], after
    assert [r["restarts"] for r in ranks] == [1, 1]
    # every member on the node left: the rendezvous store listens on its loopback alone (fray.runtime.rendezvous)
    assert {r["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"}
    assert [(r["RANK"], r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"]) for r in ranks] == [("0", "0", "2"), ("1", "1", "2")]
    assert not {w["pid"] for w in before["where"]} & {r["pid"] for r in ranks}, "fresh processes"


def _job_losing_a_node(
    cluster: Cluster, placement: str, lose: Callable[[dict[str, Any]], str]
) -> tuple[dict[str, Any], dict[str, Any], Host]:
    """Run _lost_rank_job_driver.py's job (2 ranks of member_slot 1, max_retries=0) with `placement` ("none": no
    placement); once its ranks said where they run, SIGKILL every process of the host `lose(before)` names.
    BEFORE's and AFTER's JSON, and the worker host left."""
    hosts, nodes, base, env = cluster
    err = base / "job-driver.err"
    work = base / "work"  # (the job's working directory, uploaded by Ray: not the nodes' temp directories)
    work.mkdir()
    spec = f"ray?address=http://{hosts[0].address}:{DASHBOARD_PORT}"
    argv = [sys.executable, str(JOB_DRIVER), spec, json.dumps({"member_slot": 1}), str(len(nodes)), placement]
    with open(err, "w") as errors:
        driver = hosts[0].popen(
            argv,
            cwd=str(work),
            env={**env, "RAY_AUTH_MODE": "token"},  # (fray sends the token to a cluster it did not start only so)
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    assert driver.stdin is not None and driver.stdout is not None
    try:
        before = _line(driver.stdout, "BEFORE", err, nodes)
        assert set(before["ranks"].values()) <= {hosts[1].name, hosts[2].name}, json.dumps(before)
        assert len(before["ranks"]) == 2, json.dumps(before)
        # the names as the nodes have them (the dashboard's status camel-cases them: "memberSlot" was refused)
        assert sum("member_slot" in names for names in before["nodes"]) == 2, before
        assert not any("memberSlot" in names for names in before["nodes"]), before
        lost = next(h for h in hosts if h.name == lose(before))
        left = next(h for h in hosts[1:] if h is not lost)
        lost.kill_all()
        driver.stdin.write("go\n")
        driver.stdin.flush()
        after = _line(driver.stdout, "AFTER", err, nodes)
        driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    return before, after, left


def test_a_jobs_attempt_on_a_lost_node_is_lost_and_not_counted_against_max_retries(cluster: Cluster) -> None:
    """A job of 2 ranks spread over the two worker nodes (create_job(..., placement="spread", max_retries=0), its
    supervisor on the head's node) loses one rank's node: every process of that host SIGKILLed. The attempt is
    "lost", naming that rank; with no failure retried, the next attempt runs both ranks on the node left and the
    job succeeds."""
    hosts = cluster[0]
    before, after, left = _job_losing_a_node(cluster, "spread", lambda before: str(before["ranks"]["1"]))
    assert sorted(before["ranks"].values()) == sorted([hosts[1].name, hosts[2].name]), json.dumps(before)
    assert_lost_then_succeeded(after, "lost: rank 1's node: ", left.name)


def test_a_job_without_placement_whose_node_is_lost_runs_again_on_the_node_left(cluster: Cluster) -> None:
    """A job of 2 ranks without placement (max_retries=0) whose resources only the worker nodes have: its first
    process (the supervisor, Ray's job entrypoint) holds nothing, so Ray keeps it on the head's node, and its ranks
    run on one worker node. That node is lost (every process of its host SIGKILLed): attempt 1 is "lost", not
    counted against max_retries, and attempt 2 runs both ranks on the node left; the job succeeds."""
    before, after, left = _job_losing_a_node(cluster, "none", lambda before: str(before["ranks"]["0"]))
    assert len(set(before["ranks"].values())) == 1, json.dumps(before)  # where they fit one node: all there
    assert_lost_then_succeeded(after, "lost: rank ", left.name)
