"""fray-ray on a private instance (every worker on this host) sends a call's device values as shares of the
driver's snapshots, held until the call is done (fray.runtime.device_shares; the memfd stand-in of device memory here);
results and puts travel as bytes, as Ray keeps them after their producer is done with them."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator

import pytest

import fray
from fray.registry import job_context_from, parse_spec
from fray.runtime.device_shares import share_server
from fray.runtime.device_shares.values import SHARED
from fray.telemetry.transfers import PathStats
from fray.testing import device_workloads as d
from fray_ray import RayBackend, RayJobContext

SIZE = 1 << 20


@pytest.fixture(scope="module")
def own_ctx() -> Iterator[RayJobContext]:
    """A private Ray of this module's own (not conftest's `ctx`, which the next module's tests may keep: the
    device loads its workers recorded here would be drawn on that module's timeline)."""
    context = job_context_from(RayBackend(), parse_spec(RayBackend.test_spec)[1])
    with fray.using(context):
        yield context
    context.shutdown()


def _eventually(check: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        gc.collect()
        time.sleep(0.05)


def test_a_private_instance_sends_device_arguments_as_shares(own_ctx: RayJobContext) -> None:
    ctx = own_ctx
    assert ctx.device_mode == SHARED
    before = share_server().held()
    holder = ctx.create_actor(d.BufferHolder, args=(0, 1))
    assert ctx.get(holder.summarize(d.make_buffer(4, SIZE)), timeout=120) == (SIZE, 4, 4)
    assert ctx.get(holder.device_paths(), timeout=60) == ["memfd-ipc"]
    group = ctx.create_actor_group(d.BufferHolder, 2, args=(0, 1))
    assert ctx.get(group.summarize(d.make_buffer(5, SIZE)), timeout=120) == [(SIZE, 5, 5)] * 2
    assert ctx.get(group.device_paths(), timeout=60) == [["memfd-ipc"]] * 2
    assert ctx.get(ctx.create_task(d.buffer_summary, args=(d.make_buffer(3, SIZE),)), timeout=120) == (SIZE, 3, 3)
    _eventually(lambda: share_server().held() == before, "the driver's snapshots freed once the calls were done")
    ctx.kill(holder)
    ctx.kill(group)


def test_the_device_loads_of_workers_are_in_transfer_stats(own_ctx: RayJobContext) -> None:
    """A worker's load of a shared device value is counted by its process; the driver counts it from the
    worker's events (the timeline draws the same events)."""
    ctx = own_ctx
    before = ctx.transfer_stats().get("memfd-ipc", PathStats())
    holder = ctx.create_actor(d.BufferHolder, args=(0, 1))
    for fill in (1, 2, 3):
        assert ctx.get(holder.summarize(d.make_buffer(fill, SIZE)), timeout=120) == (SIZE, fill, fill)

    def loaded() -> PathStats:
        return ctx.transfer_stats().get("memfd-ipc", PathStats())

    _eventually(lambda: loaded().count - before.count >= 3, "the worker's three loads counted by the driver")
    after = loaded()
    assert (after.count - before.count, after.bytes - before.bytes) == (3, 3 * SIZE)
    ctx.kill(holder)


def test_results_and_puts_of_device_values_travel_as_bytes(own_ctx: RayJobContext) -> None:
    ctx = own_ctx
    made = ctx.get(ctx.create_task(d.make_buffer, args=(2, SIZE)), timeout=120)
    assert d.buffer_summary(made) == (SIZE, 2, 2)
    ref = ctx.put(d.make_buffer(6, SIZE))
    del made
    gc.collect()
    held = share_server().held()
    assert ctx.get(ctx.create_task(d.buffer_summary, args=(ref,)), timeout=120) == (SIZE, 6, 6)
    assert share_server().held() == held  # (a put is Ray's object: nothing of the driver's is served for it)
