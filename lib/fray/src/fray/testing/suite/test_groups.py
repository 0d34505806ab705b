"""Actor groups: ranked gather, slices, names, members that die, gang refusal, SPMD with torch.distributed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import fray
from fray import (
    ActorAlreadyExistsError,
    ActorDiedError,
    ActorGroup,
    ActorHandle,
    ActorOptions,
    ActorUnavailableError,
    FrayError,
    InfeasibleResourcesError,
)
from fray.context import JobContext
from fray.testing import group_workloads as g
from fray.testing import requires_capability


def _name() -> str:
    return f"group-{uuid.uuid4().hex[:8]}"


def test_group_call_gathers_results_by_rank(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 8)
    try:
        assert isinstance(group, ActorGroup) and len(group) == 8
        refs = group.whoami()
        assert len(refs) == 8 and all(isinstance(r, fray.ObjectRef) for r in refs)
        infos = fray_ctx.get(refs, timeout=120)
        assert [i["rank"] for i in infos] == list(range(8))
        assert {i["size"] for i in infos} == {8}
        assert [i["init_rank"] for i in infos] == list(range(8))  # known in __init__ already
        done, _ = fray_ctx.wait(group.scaled(1), num_returns=8, timeout=120)
        assert len(done) == 8
    finally:
        fray_ctx.kill(group)


def test_group_args_kwargs_and_attribute_named_methods(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 3, kwargs={"base": 100})
    try:
        assert fray_ctx.get(group.scaled(x=2), timeout=60) == [102, 104, 106]
        assert fray_ctx.get(group.call("handles"), timeout=60) == ["rank 0", "rank 1", "rank 2"]
        assert len(group.handles) == 3 and all(isinstance(x, ActorHandle) for x in group.handles)
        with pytest.raises(AttributeError, match="no_such_method"):
            group.no_such_method()
    finally:
        fray_ctx.kill(group)


def test_group_slices_keep_the_members_ranks(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 6)
    try:
        middle = group[2:5]
        assert isinstance(middle, ActorGroup) and len(middle) == 3
        assert [i["rank"] for i in fray_ctx.get(middle.whoami(), timeout=60)] == [2, 3, 4]
        assert [i["size"] for i in fray_ctx.get(middle.whoami(), timeout=60)] == [6, 6, 6]
        picked = group[[5, 0]]
        assert [i["rank"] for i in fray_ctx.get(picked.whoami(), timeout=60)] == [5, 0]
        one = group[3]
        assert isinstance(one, ActorHandle)
        assert fray_ctx.get(one.whoami(), timeout=60)["rank"] == 3
        assert fray_ctx.get(group[-1].whoami(), timeout=60)["rank"] == 5
        with pytest.raises(IndexError):
            group[[0, 9]]
        with pytest.raises(TypeError):
            group["a"]  # type: ignore[index]
    finally:
        fray_ctx.kill(group)


def test_current_actor_in_plain_actor_and_outside(fray_ctx: JobContext) -> None:
    name = _name()
    actor = fray_ctx.create_actor(g.Member, options=ActorOptions(name=name))
    try:
        info = fray_ctx.get(actor.whoami(), timeout=60)
        assert (info["rank"], info["size"], info["name"]) == (0, 1, name)
    finally:
        fray_ctx.kill(actor)
    with pytest.raises(FrayError, match="outside any actor"):
        fray.current_actor()


def test_named_group_is_found_again(fray_ctx: JobContext) -> None:
    name = _name()
    group = fray_ctx.create_actor_group(g.Member, 2, options=ActorOptions(name=name))
    try:
        infos = fray_ctx.get(group.whoami(), timeout=60)
        assert [i["name"] for i in infos] == [f"{name}/0", f"{name}/1"]
        again = fray_ctx.create_actor_group(g.Member, 2, options=ActorOptions(name=name, get_if_exists=True))
        assert again == group
        assert fray_ctx.get_actor(f"{name}/1") == group[1]
        with pytest.raises(ActorAlreadyExistsError):
            fray_ctx.create_actor_group(g.Member, 2, options=ActorOptions(name=name))
    finally:
        fray_ctx.kill(group)


def test_group_passed_into_a_task(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 3)
    try:
        assert fray_ctx.get(fray_ctx.create_task(g.use_group, args=(group, 1)), timeout=120) == [1, 2, 3]
    finally:
        fray_ctx.kill(group)


def test_killed_member_fails_alone(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 3)
    try:
        fray_ctx.get(group.whoami(), timeout=60)
        fray_ctx.kill(group[1])
        refs = group.scaled(1)
        assert fray_ctx.get(refs[0], timeout=60) == 1
        assert fray_ctx.get(refs[2], timeout=60) == 3
        with pytest.raises(ActorDiedError):
            fray_ctx.get(refs[1], timeout=60)
    finally:
        fray_ctx.kill(group)
    with pytest.raises(ActorDiedError):
        fray_ctx.get(group[0].whoami(), timeout=60)


def test_get_of_a_group_call_raises_a_failure_without_waiting_for_the_rest(
    fray_ctx: JobContext, tmp_path: Path
) -> None:
    group = fray_ctx.create_actor_group(g.Member, 2)
    flag = tmp_path / "release"
    try:
        refs = group.fail_or_wait(str(flag))
        with pytest.raises(ValueError, match="rank 0 fails"):  # (a get waiting for rank 1 would time out)
            fray_ctx.get(refs, timeout=100)
        flag.write_text("go")
        assert fray_ctx.get(refs[1], timeout=60) == 1
    finally:
        flag.write_text("go")
        fray_ctx.kill(group)


@requires_capability("process_isolation")
def test_crashed_member_is_named_and_others_keep_their_results(fray_ctx: JobContext) -> None:
    name = _name()
    group = fray_ctx.create_actor_group(g.Member, 3, options=ActorOptions(name=name))
    try:
        fray_ctx.get(group.whoami(), timeout=60)
        crashed = group[2].crash()
        with pytest.raises(ActorDiedError, match=f"{name}/2|rank 2"):
            fray_ctx.get(crashed, timeout=60)
        assert fray_ctx.get(group[0:2].scaled(1), timeout=60) == [1, 2]
    finally:
        fray_ctx.kill(group)


@requires_capability("process_isolation")
def test_restarted_member_comes_back_with_its_rank(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 2, options=ActorOptions(max_restarts=1))
    try:
        first_pid = fray_ctx.get(group[1].pid(), timeout=60)
        with pytest.raises(ActorUnavailableError):
            fray_ctx.get(group[1].crash(), timeout=60)
        info = fray_ctx.get(group.whoami(), timeout=120)  # made while rank 1 restarts: waits for it
        assert [i["rank"] for i in info] == [0, 1]
        assert fray_ctx.get(group[1].pid(), timeout=60) != first_pid
    finally:
        fray_ctx.kill(group)


def test_infeasible_group_is_refused_at_creation(fray_ctx: JobContext) -> None:
    nodes = fray_ctx.node_resources()
    total_cpus = sum(n.get("CPU", 0.0) for n in nodes)
    with pytest.raises(InfeasibleResourcesError, match="members"):
        fray_ctx.create_actor_group(g.Member, int(total_cpus) + 1, options=ActorOptions(resources={"CPU": 1}))
    with pytest.raises(InfeasibleResourcesError, match="spread"):
        fray_ctx.create_actor_group(g.Member, len(nodes) + 1, placement="spread", strict_placement=True)
    biggest = max(n.get("CPU", 0.0) for n in nodes)
    with pytest.raises(InfeasibleResourcesError, match="pack"):
        fray_ctx.create_actor_group(
            g.Member, int(biggest) + 1, options=ActorOptions(resources={"CPU": 1}), strict_placement=True
        )
    with pytest.raises(ValueError, match="placement"):
        fray_ctx.create_actor_group(g.Member, 2, placement="scatter")
    with pytest.raises(ValueError, match="count"):
        fray_ctx.create_actor_group(g.Member, 0)


def test_best_effort_spread_over_one_node_still_creates_the_group(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 2, placement="spread")
    try:
        assert [i["rank"] for i in fray_ctx.get(group.whoami(), timeout=60)] == [0, 1]
    finally:
        fray_ctx.kill(group)


def test_group_members_hold_their_resources(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 2, options=ActorOptions(resources={"CPU": 1}))
    try:
        assert fray_ctx.get(group.scaled(1), timeout=60) == [1, 2]
    finally:
        fray_ctx.kill(group)


@requires_capability("spmd_groups")
def test_spmd_group_sets_the_torch_distributed_environment(fray_ctx: JobContext) -> None:
    group = fray_ctx.create_actor_group(g.Member, 2, distributed=True)
    try:
        envs = fray_ctx.get(
            group.env("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"), timeout=120
        )
        assert [e["RANK"] for e in envs] == ["0", "1"]
        assert {e["WORLD_SIZE"] for e in envs} == {"2"}
        assert len({e["MASTER_ADDR"] for e in envs}) == 1 and len({e["MASTER_PORT"] for e in envs}) == 1
        assert all(e["LOCAL_RANK"] is not None and e["LOCAL_WORLD_SIZE"] is not None for e in envs)
        pids = fray_ctx.get(group.pid(), timeout=60)
        assert len(set(pids)) == 2  # a process per member
    finally:
        fray_ctx.kill(group)


@requires_capability("spmd_groups")
@pytest.mark.parametrize("size", [2, 4])
def test_spmd_group_gloo_all_reduce(fray_ctx: JobContext, size: int) -> None:
    pytest.importorskip("torch", reason="torch is not installed (the all_reduce needs torch.distributed)")
    group = fray_ctx.create_actor_group(g.GlooMember, size, distributed=True)
    try:
        assert fray_ctx.get(group.all_reduce(1.0), timeout=180) == [[float(size)]] * size
        worlds = fray_ctx.get(group.world(), timeout=60)
        assert [w[0] for w in worlds] == list(range(size)) and {w[1] for w in worlds} == {size}
    finally:
        fray_ctx.kill(group)


@requires_capability("spmd_groups")
def test_spmd_rendezvous_listens_on_master_addr_alone(fray_ctx: JobContext) -> None:
    """torch's env:// rendezvous served its TCPStore on every interface of rank 0's host; fray
    serves it in rank 0's process on MASTER_ADDR alone, loopback when every member is on one host."""
    pytest.importorskip("torch", reason="torch is not installed (the rendezvous is torch.distributed's)")
    group = fray_ctx.create_actor_group(g.GlooMember, 2, distributed=True)
    try:
        assert fray_ctx.get(group.all_reduce(1.0), timeout=180) == [[2.0]] * 2  # the rendezvous worked
        master = fray_ctx.get(group.master_addr(), timeout=60)[0]
        listeners = fray_ctx.get(group[0].rendezvous_listeners(), timeout=60)
        assert listeners == [master], f"the rendezvous store listens on {listeners}, not on {master} alone"
        if len(fray_ctx.node_resources()) == 1:  # every member on this one host
            assert master == "127.0.0.1"
    finally:
        fray_ctx.kill(group)
