"""A real two-node Ray cluster on this machine: placement by resources, a detached actor seen by a second
driver, and actor groups placed over the nodes (pack, spread, strict, SPMD with gloo). The cluster and both
drivers run in a subprocess (_multinode_driver.py), run once for the module, since Ray allows one connection
per process and this pytest process may hold the conformance suite's. That subprocess stops exactly the cluster
it started; on a timeout the fixture kills exactly that subprocess's process group."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fray_ray")

from _procs import run_driver

DRIVER = Path(__file__).with_name("_multinode_driver.py")


@pytest.fixture(scope="module")
def driver_result() -> dict[str, Any]:
    """What the driver saw (it starts one cluster for every test of this module)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return run_driver(DRIVER, "multi-node driver", 420, env)


def test_two_nodes_placement_and_detached_actor_from_second_driver(driver_result: dict[str, Any]) -> None:
    out = driver_result
    assert out["nodes"] == 2
    assert out["head"] != out["worker"]
    assert out["task_head"] == out["head"]
    assert out["task_worker"] == out["worker"]
    assert out["actor"] == out["worker"]
    # the second driver found the named detached actor, on the worker node, with the first driver's state
    assert out["second_driver"] == [out["worker"], "2"]
    assert out["infeasible"] == "refused"


def test_groups_pack_and_spread_over_two_nodes(driver_result: dict[str, Any]) -> None:
    out = driver_result
    both = {out["head"], out["worker"]}
    assert len(set(out["pack"])) == 1  # as few nodes as possible: the two members fit on one
    assert set(out["spread"]) == both  # best effort over nodes: one member on each
    assert set(out["strict_spread"]) == both
    assert out["strict_pack"] == "refused"  # 2 x 1 CPU on one node of 1 CPU: refused at creation


def test_spmd_group_over_two_nodes_runs_gloo(driver_result: dict[str, Any]) -> None:
    out = driver_result
    ranks = out["spmd"]
    assert {r["node"] for r in ranks} == {out["head"], out["worker"]}
    master = out["addresses"][ranks[0]["node"]]  # rank 0's node address
    assert {r["MASTER_ADDR"] for r in ranks} == {master}
    assert len({r["MASTER_PORT"] for r in ranks}) == 1
    assert [(r["RANK"], r["WORLD_SIZE"]) for r in ranks] == [("0", "2"), ("1", "2")]
    assert [(r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"]) for r in ranks] == [("0", "1"), ("0", "1")]  # one per node
    assert out["all_reduce"] == [3.0, 3.0]
