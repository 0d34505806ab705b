"""Device values on every path, with the CPU stand-in of device memory (fray.device_shares.MemfdBuffer: it
travels as a CUDA tensor does, in the backend's device mode): put -> get, driver -> task, task -> driver,
actor -> actor; each reader gets a copy of its own, and a value sent stays what it was when sent."""

from __future__ import annotations

from fray.context import JobContext
from fray.device_shares import MemfdBuffer
from fray.testing import device_workloads as d

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
