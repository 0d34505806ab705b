"""A backend whose jobs' first process is kept apart from their ranks (ClusterContext.ranks_apart: Ray): a
supervised job's ranks that hold resources and have no placement are a group on one node (fray.jobs.requests
ONE_NODE), the job's first process holding nothing; and such a rank sees only its own GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from fray.errors import InfeasibleResourcesError
from fray.jobs.group_ranks import _see_own_gpus, own_gpus_of
from fray.jobs.policy import JobPolicy
from fray.jobs.requests import ONE_NODE, launch_of, place
from fray.jobs.supervisor_args import parse_args


def _nodes(*cpus: float) -> Any:
    return lambda: [{"node": f"n{i}", "total": {"CPU": c}} for i, c in enumerate(cpus)]


def _launch(replicas: Any, cpu: float, retries: int = 0, placement: str | None = None) -> Any:
    policy = JobPolicy.of(retries, None, None, None, None)
    return launch_of(["true"], (), None, policy, replicas, {"CPU": cpu}, placement)


def test_a_supervised_jobs_ranks_with_resources_are_a_group_on_one_node_its_first_process_holding_nothing() -> None:
    placed = place(_launch(2, 1.0), _nodes(4, 4), True, "ray", apart=True)
    assert placed.placement == ONE_NODE and placed.whole_job() == []
    argv = placed.command(["true"], "python")
    assert argv[argv.index("--placement") + 1] == "node" and '{"CPU": 1.0}' in argv
    single = place(_launch(1, 1.0, retries=2), _nodes(4), True, "ray", apart=True)
    assert single.placement == ONE_NODE and single.whole_job() == []  # one rank, supervised (retries)
    assert place(_launch(2, 1.0), _nodes(4, 4), True, "ray").placement is None  # a backend that does not
    # where they do not fit one node: over the nodes, as without ranks_apart
    assert place(_launch(6, 1.0), _nodes(4, 4), True, "ray", apart=True).placement == "pack"
    assert place(_launch(2, 1.0, placement="spread"), _nodes(4, 4), True, "ray", apart=True).placement == "spread"


def test_a_plain_command_or_a_job_without_resources_stays_as_it_is() -> None:
    plain = place(_launch(1, 1.0), _nodes(4), True, "ray", apart=True)
    assert plain.placement is None and not plain.supervised and [r.quantity for r in plain.whole_job()] == [1.0]
    bare = launch_of(["true"], (), None, JobPolicy(), 2, None, None)
    assert place(bare, _nodes(4), True, "ray", apart=True).placement is None


def test_ranks_no_node_could_hold_are_refused_at_submission_one_rank_too() -> None:
    with pytest.raises(InfeasibleResourcesError, match="hold 0 such ranks"):
        place(_launch(1, 8.0, retries=1), _nodes(4, 4), True, "ray", apart=True)
    with pytest.raises(InfeasibleResourcesError, match="hold 0 such ranks"):
        place(_launch(1, 8.0, placement="pack"), _nodes(4, 4), True, "ray")


def test_an_elastic_jobs_ranks_on_one_node_are_counted_at_submission() -> None:
    placed = place(_launch((1, 8), 1.0), _nodes(3), True, "ray", apart=True)
    assert placed.placement == ONE_NODE and placed.replicas == 3
    argv = placed.command(["true"], "python")
    assert argv[argv.index("--replicas") + 1] == "3"  # a fixed count: not MIN:MAX
    assert place(_launch((1, 8), 1.0), _nodes(4, 4), True, "ray", apart=True).placement == "pack"  # more fit over


def test_one_node_is_the_supervisors_not_a_users_placement() -> None:
    with pytest.raises(ValueError, match="placement must be one of"):
        _launch(2, 1.0, placement=ONE_NODE)
    assert parse_args(["--placement", "node", "--rank-resources", "{}", "--", "true"], "").placement == "node"


def test_a_rank_of_a_group_on_one_node_sees_only_its_own_gpus() -> None:
    assert own_gpus_of(ONE_NODE, {"GPU": 2.0}) == 2 and own_gpus_of("pack", {"GPU": 2.0}) == 0
    env = {"CUDA_VISIBLE_DEVICES": "3,1,0,2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    _see_own_gpus(env, 2)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2"  # the members' devices in local rank order: rank 1's slice
    kept = {"CUDA_VISIBLE_DEVICES": "5,6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}  # its own view kept
    _see_own_gpus(kept, 2)
    assert kept["CUDA_VISIBLE_DEVICES"] == "5,6"
