"""On monarch a node is a host, as on Ray and in `fray status`: a task or actor may ask for as much as one host has,
though the host runs several worker processes (issue 28: `{"CPU": 2}` was refused on a 2-CPU host with 2 worker
processes, "largest node: {CPU: 1 ...}")."""

from __future__ import annotations

import os

import pytest

import fray
from fray import ActorOptions, InfeasibleResourcesError, TaskOptions
from fray.testing import workloads as h


def _pid() -> int:
    return os.getpid()


class _Whole:
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def two_procs_two_cpus() -> fray.JobContext:
    ctx = fray.init("monarch?procs=2&cpus=2")
    yield ctx
    fray.shutdown()


def test_a_task_and_an_actor_may_ask_for_a_whole_host(two_procs_two_cpus: fray.JobContext) -> None:
    ctx = two_procs_two_cpus
    assert ctx.node_resources()[0]["CPU"] == 2.0 and len(ctx.node_resources()) == 1
    whole = TaskOptions(resources={"CPU": 2})
    assert ctx.get([ctx.create_task(h.add, args=(i, 1), options=whole) for i in range(3)], timeout=120) == [1, 2, 3]
    actor = ctx.create_actor(_Whole, options=ActorOptions(resources={"CPU": 2}))
    assert ctx.get(actor.pid(), timeout=120) > 0
    # the actor holds the host's 2 CPUs: a task asking for one waits until it is gone
    ref = ctx.create_task(h.add, args=(1, 1))
    assert ctx.wait([ref], timeout=2.0)[0] == []
    ctx.kill(actor)
    assert ctx.get(ref, timeout=120) == 2
    # and the CPUs were given back each time: ordinary tasks run on both processes
    assert ctx.get([ctx.create_task(h.add, args=(1, 1)) for _ in range(4)], timeout=120) == [2] * 4


def test_more_than_a_host_has_is_refused_naming_the_largest_host(two_procs_two_cpus: fray.JobContext) -> None:
    with pytest.raises(InfeasibleResourcesError, match=r"CPU"):
        two_procs_two_cpus.create_task(h.add, args=(1, 1), options=TaskOptions(resources={"CPU": 3}))
