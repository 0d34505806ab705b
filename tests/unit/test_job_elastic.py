"""Elastic ranks' arguments: create_job's replicas=(min, max), the command line's --replicas MIN:MAX, how many
ranks a job is given against the nodes' totals, and the supervisor's argument (fray.jobs.elastic)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fray.cli import main as fray_main
from fray.errors import InfeasibleResourcesError
from fray.jobs.elastic import parse_replicas, replica_bounds, world_size
from fray.jobs.policy import JobPolicy
from fray.jobs.requests import launch_of, place
from fray.jobs.supervisor_args import parse_args


def test_replicas_are_an_int_or_a_pair_min_max() -> None:
    assert replica_bounds(3) == (3, 3)
    assert replica_bounds((2, 8)) == (2, 8) and replica_bounds([1, 1]) == (1, 1)
    for bad in ((0, 2), (3, 2), (-1, 4)):
        with pytest.raises(ValueError, match=r"1 <= min <= max"):
            replica_bounds(bad)
    for bad in ((1, 2, 3), (1,), (1.0, 2), (True, 2), ("1", "2")):
        with pytest.raises(ValueError, match=r"pair of ints \(min, max\)"):
            replica_bounds(bad)
    with pytest.raises(ValueError, match=">= 1"):
        replica_bounds(0)
    with pytest.raises(TypeError, match="pair"):
        replica_bounds(2.0)


def test_the_command_line_takes_n_or_min_colon_max() -> None:
    assert parse_replicas("4") == 4
    assert parse_replicas("2:8") == (2, 8)
    for bad in ("2:", ":8", "a:b", "2:8:9", "two"):
        with pytest.raises(ValueError, match="N or MIN:MAX"):
            parse_replicas(bad)
    for bad in ("8:2", "0:4"):
        with pytest.raises(ValueError, match="min <= max"):
            parse_replicas(bad)


def test_fray_job_submit_refuses_a_bad_range_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert fray_main(["job", "submit", "--replicas", "8:2", "--", "true"]) == 2
    assert "1 <= min <= max" in capsys.readouterr().err


def _nodes(*cpus: float) -> Any:
    return lambda: [{"node": f"n{i}", "total": {"CPU": c}} for i, c in enumerate(cpus)]


def _launch(replicas: Any, cpu: float, placement: str | None = None) -> Any:
    return launch_of(["true"], (), None, JobPolicy(), replicas, {"CPU": cpu}, placement)


def test_on_one_node_an_elastic_job_gets_the_ranks_its_totals_hold() -> None:
    placed = place(_launch((1, 8), 1.0), _nodes(3), False, "in_memory")
    assert placed.replicas == 3 and placed.placement is None
    assert "--replicas" in (argv := placed.command(["true"], "python")) and "3" in argv
    assert [r.quantity for r in placed.whole_job()] == [3.0]  # the job holds its three ranks' CPUs
    assert place(_launch((1, 2), 1.0), _nodes(3), False, "x").replicas == 2  # never above max
    one = place(_launch((1, 4), 2.0), _nodes(3), False, "x")
    assert one.replicas == 1 and one.supervised  # one rank, still supervised: its record has the world size
    with pytest.raises(InfeasibleResourcesError, match="fewer than its min of 4"):
        place(_launch((4, 8), 1.0), _nodes(3), False, "x")


def test_over_several_nodes_the_supervisor_counts_the_ranks_at_each_attempt() -> None:
    placed = place(_launch((1, 8), 1.0), _nodes(4, 4), True, "ray")
    assert placed.placement == "pack" and "1:8" in placed.command(["true"], "python")
    assert place(_launch((1, 4), 1.0), _nodes(4, 4), True, "ray").placement is None  # max fits one node
    with pytest.raises(InfeasibleResourcesError, match="hold 8 such ranks"):
        place(_launch((9, 12), 1.0), _nodes(4, 4), True, "ray")
    assert world_size((1, 8), {"CPU": 1.0}, [{"CPU": 4.0}, {"CPU": 4.0}]) == 8
    assert world_size((1, 8), {"CPU": 1.0}, [{"CPU": 3.0}]) == 3  # a node lost: fewer
    assert world_size((4, 8), {"CPU": 1.0}, [{"CPU": 3.0}]) == 4  # never below min (the group then fares as fixed)
    assert world_size((2, 8), {}, [{"CPU": 1.0}]) == 8  # nothing limits them


def test_the_supervisor_takes_min_colon_max_with_a_placement() -> None:
    assert parse_args(["--replicas", "2:4", "--placement", "pack", "--", "true"], "").replicas == (2, 4)
    assert parse_args(["--replicas", "3", "--", "true"], "").replicas == 3
    with pytest.raises(SystemExit):
        parse_args(["--replicas", "2:4", "--", "true"], "")  # on one host, create_job has counted them


def test_fray_run_with_min_colon_max_sets_the_world_size_of_the_ranks_that_fit(tmp_path: Path) -> None:
    cpus = os.cpu_count() or 1
    code = "import os; print('world', os.environ['WORLD_SIZE'])"
    done = subprocess.run(
        [sys.executable, "-m", "fray.cli", "run", "--backend", "in_memory", "--replicas", "1:8",
         "--cpus", str(cpus / 2), "--", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120, env={**os.environ, "FRAY_STATE_DIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[rank 1] world 2" in done.stdout and "[rank 2]" not in done.stdout, done.stdout
