"""Device values on every path, with the CPU stand-in of device memory (fray.runtime.device_shares.MemfdBuffer: it
travels as a CUDA tensor does, in the backend's device mode): put -> get, driver -> task, task -> driver,
actor -> actor; each reader gets a copy of its own, and a value sent stays what it was when sent; where the
backend declares device_shares, what the driver sends to another process goes by shares and is let go."""

from __future__ import annotations

import gc
import time

from fray.context import JobContext
from fray.runtime.device_shares import MemfdBuffer, share_server
from fray.telemetry.transfers import device_stats, since
from fray.testing import device_workloads as d
from fray.testing import requires_capability

SIZE = 1 << 20  # large enough to travel out of band on every backend


def test_a_device_value_put_is_got_back_whole(fray_ctx: JobContext) -> None:
    value = d.make_buffer(7, SIZE)
    ref = fray_ctx.put(value)
    value.write_at(0, b"\x00")  # (after the put: the stored value is a snapshot)
    got = fray_ctx.get(ref, timeout=120)
    assert isinstance(got, MemfdBuffer)
    assert d.buffer_summary(got) == (SIZE, 7, 7)


def test_a_device_value_goes_to_a_task_and_comes_back(fray_ctx: JobContext) -> None:
    value = d.make_buffer(3, SIZE)
    assert fray_ctx.get(fray_ctx.create_task(d.buffer_summary, args=(value,)), timeout=120) == (SIZE, 3, 3)
    made = fray_ctx.get(fray_ctx.create_task(d.make_buffer, args=(5, SIZE)), timeout=120)
    assert d.buffer_summary(made) == (SIZE, 5, 5)


def test_every_reader_of_a_device_value_gets_a_copy_of_its_own(fray_ctx: JobContext) -> None:
    ref = fray_ctx.put(d.make_buffer(9, SIZE))
    writers = [fray_ctx.create_task(d.overwrite_and_summarize, args=(ref,)) for _ in range(2)]
    assert fray_ctx.get(writers, timeout=120) == [(SIZE, 255, 9)] * 2
    assert d.buffer_summary(fray_ctx.get(ref, timeout=120)) == (SIZE, 9, 9)


def test_a_device_value_goes_from_actor_to_actor(fray_ctx: JobContext) -> None:
    holder = fray_ctx.create_actor(d.BufferHolder, args=(11, SIZE))
    reader = fray_ctx.create_actor(d.BufferHolder, args=(0, 1))
    made = holder.get()
    assert fray_ctx.get(reader.summarize(made), timeout=120) == (SIZE, 11, 11)
    assert d.buffer_summary(fray_ctx.get(made, timeout=120)) == (SIZE, 11, 11)


@requires_capability("device_shares")
@requires_capability("spmd_groups")
def test_device_values_the_driver_sends_to_other_processes_go_by_shares_and_are_let_go(fray_ctx: JobContext) -> None:
    """(SPMD members: in another process on every backend.) Each member copies from a share of its own; the
    driver serves the snapshot until the calls are done and the value is gone."""
    before = share_server().held()
    group = fray_ctx.create_actor_group(d.BufferHolder, 2, args=(0, 1), distributed=True)
    try:
        assert fray_ctx.get(group.summarize(d.make_buffer(13, SIZE)), timeout=120) == [(SIZE, 13, 13)] * 2
        assert fray_ctx.get(group.device_paths(), timeout=60) == [["memfd-ipc"]] * 2
        deadline = time.monotonic() + 60
        while share_server().held() != before:  # (let go when the call's object is freed, or the members say so)
            assert time.monotonic() < deadline, "the driver still serves a device value its calls are done with"
            gc.collect()
            fray_ctx.get(group.snapshots_held(), timeout=60)
            time.sleep(0.05)
    finally:
        fray_ctx.kill(group)


def test_a_get_into_a_device_buffer_of_the_callers_fills_it_without_a_copy_of_its_own_first(
    fray_ctx: JobContext,
) -> None:
    """`get(ref, out=...)` copies a device value into the caller's own buffers (inside a dict), the same ones
    returned; where the value comes by a share (a task's result, on a backend that sends results so), the share is
    read into `out` itself, never first copied into memory of the reader's (`memfd-ipc-out`, not `memfd-ipc`)."""
    made = fray_ctx.create_task(d.make_buffer, args=(21, SIZE))
    fray_ctx.wait([made], timeout=120)
    out = {"weights": d.make_buffer(0, SIZE)}
    before = device_stats.snapshot()
    got = fray_ctx.get(fray_ctx.create_task(d.in_a_dict, args=(made,)), timeout=120, out=out)
    paths = sorted(since(device_stats.snapshot(), before))
    assert got is out and d.buffer_summary(out["weights"]) == (SIZE, 21, 21), paths
    assert "memfd-ipc" not in paths, f"the value was copied before it went into out: {paths}"
