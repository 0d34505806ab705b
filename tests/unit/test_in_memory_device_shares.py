"""in_memory's child processes (SPMD members, runtime_env tasks) exchange device values through shares of the
sender's snapshot (the memfd stand-in of device memory): each side holds a snapshot while the other's copy of
the value lives, and lets it go when told; a member's values are lost with it."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator

import pytest

import fray
from fray import RuntimeEnv, TaskOptions
from fray.context import JobContext
from fray.errors import ObjectLostError
from fray.runtime.device_shares import share_server
from fray.testing import device_workloads as d

SIZE = 1 << 20
OWN_PROCESS = TaskOptions(runtime_env=RuntimeEnv(env={"FRAY_TEST_OWN_PROCESS": "1"}))


@pytest.fixture
def ctx() -> Iterator[JobContext]:
    ctx = fray.init("in_memory")
    try:
        yield ctx
    finally:
        ctx.shutdown()


def _eventually(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        gc.collect()
        time.sleep(0.05)


def test_a_members_device_value_reaches_the_driver_and_another_member_through_shares(ctx: JobContext) -> None:
    group = ctx.create_actor_group(d.BufferHolder, 2, args=(11, SIZE), distributed=True)
    made = group.get()
    assert [d.buffer_summary(v) for v in ctx.get(made, timeout=60)] == [(SIZE, 11, 11)] * 2
    assert ctx.transfer_stats()["memfd-ipc"].count == 2
    assert ctx.get(group.summarize(made[0]), timeout=60) == [(SIZE, 11, 11)] * 2
    assert ctx.get(group.snapshots_held(), timeout=60) == [1, 1]  # each member serves the value the driver keeps
    del made
    gc.collect()
    # (a member hears that the driver let go in the driver's next message to it)
    _eventually(lambda: ctx.get(group.snapshots_held(), timeout=60) == [0, 0], "the members' snapshots freed")


def test_the_drivers_device_values_reach_members_and_tasks_and_are_let_go(ctx: JobContext) -> None:
    group = ctx.create_actor_group(d.BufferHolder, 2, args=(0, 1), distributed=True)
    before = share_server().held()
    assert ctx.get(group.summarize(d.make_buffer(4, SIZE)), timeout=60) == [(SIZE, 4, 4)] * 2
    ref = ctx.put(d.make_buffer(6, SIZE))
    assert ctx.get(group.summarize(ref), timeout=60) == [(SIZE, 6, 6)] * 2
    assert ctx.get(group.device_paths(), timeout=60) == [["memfd-ipc"]] * 2
    assert ctx.get(ctx.create_task(d.buffer_summary, args=(ref,), options=OWN_PROCESS), timeout=60) == (SIZE, 6, 6)
    made = ctx.get(ctx.create_task(d.make_buffer, args=(2, SIZE), options=OWN_PROCESS), timeout=60)
    assert d.buffer_summary(made) == (SIZE, 2, 2)  # (a task process ends with its reply: its result is staged)
    del ref
    gc.collect()
    ctx.get(group.snapshots_held(), timeout=60)  # (members say what they let go in their next reply)
    _eventually(lambda: share_server().held() == before, "the driver's snapshots freed")


def test_a_killed_members_device_values_are_lost(ctx: JobContext) -> None:
    group = ctx.create_actor_group(d.BufferHolder, 2, args=(5, SIZE), distributed=True)
    made = group.get()
    ctx.wait(made, num_returns=2, timeout=60)
    ctx.kill(group)
    with pytest.raises(ObjectLostError, match="the process that made it is gone"):
        ctx.get(made[0], timeout=60)
