"""GPUs assigned to the work that asks for them (fray.runtime.gpus): on declared GPUs, so that a machine without a
device tests the assignment (as Ray's num_gpus declares them). A backend whose test context declares GPUs is tested
with it; others get a context of their own with `gpus=N` (N: the GPUs found here, else 2 declared)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fray import ActorOptions, ActorUnavailableError, InfeasibleResourcesError, RuntimeEnv, TaskOptions
from fray.context import JobContext
from fray.registry import get_backend, job_context_from
from fray.runtime.capabilities import Capability
from fray.runtime.current import using
from fray.runtime.gpus import discover
from fray.testing import workloads as h
from fray.testing.plugin import requires_capability, spec_options

ONE_GPU = TaskOptions(resources={"CPU": 0.5, "GPU": 1})


@pytest.fixture(scope="module")
def gpu_ctx(fray_backend_name: str, fray_session_ctx: JobContext) -> Iterator[JobContext]:
    """A context whose host has GPUs: the session's if it declares them, else one of its own."""
    if max((n.get("GPU", 0.0) for n in fray_session_ctx.node_resources()), default=0.0) >= 1:
        with using(fray_session_ctx):
            yield fray_session_ctx
        return
    count = len(discover()) or 2
    options = {**spec_options(fray_backend_name, "test_spec"), "gpus": str(count)}
    ctx = job_context_from(get_backend(fray_backend_name), options)
    try:
        with using(ctx):
            yield ctx
    finally:
        ctx.shutdown()


def _devices(ctx: JobContext) -> int:
    return int(max(n.get("GPU", 0.0) for n in ctx.node_resources()))


def _needs_two(ctx: JobContext) -> None:
    if _devices(ctx) < 2:
        pytest.skip(f"needs 2 GPUs on one host; this context's largest node has {_devices(ctx)}")


def test_work_without_gpus_holds_none(gpu_ctx: JobContext) -> None:
    assert gpu_ctx.get(gpu_ctx.create_task(h.held_gpus), timeout=120) == []


def test_a_task_asking_for_a_gpu_is_told_which_it_holds(gpu_ctx: JobContext) -> None:
    held = gpu_ctx.get(gpu_ctx.create_task(h.held_gpus, options=ONE_GPU), timeout=120)
    assert len(held) == 1 and 0 <= held[0] < max(_devices(gpu_ctx), 2) + 8


def test_actors_holding_a_gpu_each_hold_different_devices(gpu_ctx: JobContext) -> None:
    _needs_two(gpu_ctx)
    opts = ActorOptions(resources={"GPU": 1})
    first, second = gpu_ctx.create_actor(h.GpuHolder, options=opts), gpu_ctx.create_actor(h.GpuHolder, options=opts)
    try:
        a, b = gpu_ctx.get([first.gpus(), second.gpus()], timeout=120)
        assert len(a) == 1 and len(b) == 1 and a != b
        # and a task asking for a whole GPU while both are held waits for one of them
        ref = gpu_ctx.create_task(h.held_gpus, options=ONE_GPU)
        done, _ = gpu_ctx.wait([ref], timeout=1.0)
        assert not done
        gpu_ctx.kill(first)
        assert gpu_ctx.get(ref, timeout=120) == a
    finally:
        gpu_ctx.kill(second)


def test_fractions_of_a_gpu_share_one_device(gpu_ctx: JobContext) -> None:
    opts = ActorOptions(resources={"GPU": 0.5})
    first, second = gpu_ctx.create_actor(h.GpuHolder, options=opts), gpu_ctx.create_actor(h.GpuHolder, options=opts)
    try:
        a, b = gpu_ctx.get([first.gpus(), second.gpus()], timeout=120)
        assert len(a) == 1 and a == b
    finally:
        gpu_ctx.kill(first)
        gpu_ctx.kill(second)


def test_a_task_may_hold_every_gpu_of_a_host(gpu_ctx: JobContext) -> None:
    _needs_two(gpu_ctx)
    both = TaskOptions(resources={"CPU": 0.5, "GPU": 2})
    held = gpu_ctx.get(gpu_ctx.create_task(h.held_gpus, options=both), timeout=120)
    assert len(held) == 2 and len(set(held)) == 2


def test_a_process_started_for_gpu_work_sees_just_its_devices(gpu_ctx: JobContext) -> None:
    if Capability.TASK_ENV_VARS not in gpu_ctx.capabilities:
        pytest.skip(f"backend {gpu_ctx.backend!r} lacks capability 'task_env_vars'")
    opts = TaskOptions(resources={"CPU": 0.5, "GPU": 1}, runtime_env=RuntimeEnv(env={"FRAY_TEST_MARK": "1"}))
    held, visible = gpu_ctx.get(gpu_ctx.create_task(h.gpus_and_visible, options=opts), timeout=120)
    assert len(held) == 1
    assert visible == str(held[0])


def test_gpu_requests_beyond_a_host_or_not_whole_are_refused(gpu_ctx: JobContext) -> None:
    too_many = _devices(gpu_ctx) + 1
    with pytest.raises(InfeasibleResourcesError, match="GPU"):
        gpu_ctx.create_task(h.held_gpus, options=TaskOptions(resources={"GPU": too_many}))
    with pytest.raises(ValueError, match="whole number"):
        TaskOptions(resources={"GPU": 1.5})


def test_spmd_members_see_their_groups_devices_so_local_rank_picks_their_own(gpu_ctx: JobContext) -> None:
    """As under torchrun: `torch.cuda.set_device(LOCAL_RANK)` in a member is that member's own device."""
    _needs_two(gpu_ctx)
    if Capability.SPMD_GROUPS not in gpu_ctx.capabilities:
        pytest.skip(f"backend {gpu_ctx.backend!r} lacks capability 'spmd_groups'")
    opts = ActorOptions(resources={"CPU": 0.5, "GPU": 1})
    group = gpu_ctx.create_actor_group(h.GpuMember, 2, options=opts, distributed=True)
    try:
        views = gpu_ctx.get(group.view(), timeout=120)
        held = [v[0] for v in views]
        assert all(len(h) == 1 for h in held) and held[0] != held[1]
        for mine, visible, local_rank in views:
            assert visible is not None
            assert visible.split(",")[local_rank] == str(mine[0])
    finally:
        gpu_ctx.kill(group)


def test_an_spmd_group_holding_gpus_restarts_seeing_the_same_devices(gpu_ctx: JobContext) -> None:
    _needs_two(gpu_ctx)
    if Capability.SPMD_GANG_RESTART not in gpu_ctx.capabilities:
        pytest.skip(f"backend {gpu_ctx.backend!r} lacks capability 'spmd_gang_restart'")
    opts = ActorOptions(resources={"CPU": 0.5, "GPU": 1}, max_restarts=1)
    group = gpu_ctx.create_actor_group(h.GpuMember, 2, options=opts, distributed=True)
    try:
        before = gpu_ctx.get(group.view(), timeout=120)
        with pytest.raises(ActorUnavailableError):  # in flight at the death
            gpu_ctx.get(group[1].crash_now(), timeout=120)
        after = gpu_ctx.get(group.view(), timeout=180)  # made while the group restarts: waits for it
        assert sorted(v[0][0] for v in after) == sorted(v[0][0] for v in before)
        # each member's (held, CUDA_VISIBLE_DEVICES, LOCAL_RANK) in the message: once (1 of ~3 CI runs on monarch,
        # never alone) a member's view here named fewer devices than its LOCAL_RANK indexes
        seen = f"before the restart {before}, after {after}"
        for mine, visible, local_rank in after:
            assert visible is not None and len(visible.split(",")) > local_rank, seen
            assert visible.split(",")[local_rank] == str(mine[0]), seen
        if _devices(gpu_ctx) == 2:  # the restarted group still holds both: a one-GPU task starts once it is gone
            ref = gpu_ctx.create_task(h.held_gpus_since, options=ONE_GPU)
            gpu_ctx.wait([ref], timeout=3.0)
            killed = time.time()
            gpu_ctx.kill(group)
            held, started = gpu_ctx.get(ref, timeout=120)
            assert len(held) == 1 and started >= killed
    finally:
        gpu_ctx.kill(group)


@pytest.mark.parametrize("distributed", [False, True], ids=["group", "spmd"])
def test_group_members_sharing_a_gpu_see_it_once(gpu_ctx: JobContext, distributed: bool) -> None:
    """Members holding fractions of one device see it once: CUDA refuses a CUDA_VISIBLE_DEVICES that names a
    device twice ("invalid device ordinal" at CUDA's first use, seen on an H100 with two 0.25-GPU members)."""
    if distributed and Capability.SPMD_GROUPS not in gpu_ctx.capabilities:
        pytest.skip(f"backend {gpu_ctx.backend!r} lacks capability 'spmd_groups'")
    opts = ActorOptions(resources={"CPU": 0.5, "GPU": 0.25})
    group = gpu_ctx.create_actor_group(h.GpuMember, 2, options=opts, distributed=distributed)
    try:
        views = gpu_ctx.get(group.view(), timeout=120)
        assert views[0][0] == views[1][0], views  # both on the one device they share
        for mine, visible, _ in views:
            names = visible.split(",") if visible else []
            assert len(names) == len(set(names)), views
            assert visible is None or str(mine[0]) in names, views
    finally:
        gpu_ctx.kill(group)


@requires_capability("gpu_host_view")
def test_with_gpu_view_host_gpu_work_sees_every_device_its_own_first(fray_ctx: JobContext) -> None:
    """gpu_view=host: a process started for work holding GPUs sees the host's other devices too (CUDA IPC between
    devices needs that), after its own, so that `cuda:0` and LOCAL_RANK still name its own."""
    count = max(len(discover()), 2)
    options = {**spec_options(fray_ctx.backend, "test_spec"), "gpus": str(count), "gpu_view": "host"}
    ctx = job_context_from(get_backend(fray_ctx.backend), options)
    try:
        with using(ctx):
            every = {str(i) for i in range(count)} if not discover().ids else {str(i) for i in discover().ids}
            opts = TaskOptions(resources={"CPU": 0.5, "GPU": 1}, runtime_env=RuntimeEnv(env={"FRAY_TEST_MARK": "1"}))
            held, visible = ctx.get(ctx.create_task(h.gpus_and_visible, options=opts), timeout=120)
            assert visible is not None and len(held) == 1
            assert visible.split(",")[0] == str(held[0]) and set(visible.split(",")) == every, visible
            if Capability.SPMD_GROUPS in ctx.capabilities:
                member = ActorOptions(resources={"CPU": 0.5, "GPU": 1})
                group = ctx.create_actor_group(h.GpuMember, 2, options=member, distributed=True)
                for mine, seen, local_rank in ctx.get(group.view(), timeout=120):
                    names = (seen or "").split(",")
                    assert names[local_rank] == str(mine[0]) and set(names) == every, (mine, seen, local_rank)
                ctx.kill(group)
    finally:
        ctx.shutdown()
