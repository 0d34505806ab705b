"""Actors before and after: calls wait for __init__, and refs an actor keeps stay readable while it keeps them."""

from __future__ import annotations

import gc

from fray import ActorOptions
from fray.context import JobContext
from fray.testing import workloads as h


def test_calls_wait_for_init_at_any_concurrency(fray_ctx: JobContext) -> None:
    actor = fray_ctx.create_actor(h.SlowInit, args=(0.5,), options=ActorOptions(max_concurrency=4))
    try:
        assert fray_ctx.get([actor.check() for _ in range(8)], timeout=120) == [True] * 8
    finally:
        fray_ctx.kill(actor)


def _drop_and_collect() -> None:
    gc.collect()  # (a ref freed by the collector, as well as by its count)


def test_refs_handed_to_an_actor_inside_structures_outlive_the_drivers(fray_ctx: JobContext) -> None:
    keeper = fray_ctx.create_actor(h.RefKeeper)
    try:
        fray_ctx.get(keeper.keep("list", [fray_ctx.put(7), fray_ctx.put("seven")]), timeout=60)
        fray_ctx.get(keeper.keep("dict", {"a": fray_ctx.create_task(h.add, args=(1, 2))}), timeout=60)
        _drop_and_collect()  # the driver's own refs are gone: only the actor holds them now
        assert fray_ctx.get(keeper.read("list"), timeout=60) == [7, "seven"]
        assert fray_ctx.get(keeper.read("dict"), timeout=60) == {"a": 3}
        assert fray_ctx.get(keeper.read("list"), timeout=60) == [7, "seven"]  # read again: still kept
    finally:
        fray_ctx.kill(keeper)


def test_refs_an_actor_made_itself_outlive_the_call_that_made_them(fray_ctx: JobContext) -> None:
    keeper = fray_ctx.create_actor(h.RefKeeper)
    try:
        fray_ctx.get(keeper.put_and_keep("put", list(range(1000))), timeout=60)
        fray_ctx.get(keeper.task_and_keep("task", 20, 22), timeout=60)
        _drop_and_collect()
        assert fray_ctx.get(keeper.read("put"), timeout=60) == list(range(1000))
        assert fray_ctx.get(keeper.read("task"), timeout=60) == 42
    finally:
        fray_ctx.kill(keeper)


def test_a_kept_ref_handed_back_to_the_driver_reads_there(fray_ctx: JobContext) -> None:
    keeper = fray_ctx.create_actor(h.RefKeeper)
    try:
        fray_ctx.get(keeper.keep("list", [fray_ctx.put({"k": 1})]), timeout=60)
        _drop_and_collect()
        (ref,) = fray_ctx.get(keeper.read_refs("list"), timeout=60)
        assert fray_ctx.get(ref, timeout=60) == {"k": 1}
    finally:
        fray_ctx.kill(keeper)
