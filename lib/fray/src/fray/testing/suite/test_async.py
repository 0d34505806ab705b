"""Async: `await ref`, `ref.future()`, `fray.as_completed`, and `async def` actor methods."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from pathlib import Path

import pytest

import fray
from fray import ActorOptions, GetTimeoutError
from fray.context import JobContext
from fray.testing import group_workloads as g
from fray.testing import requires_capability
from fray.testing import workloads as h


def test_await_a_ref_without_blocking_the_event_loop(fray_ctx: JobContext, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    ref = fray_ctx.create_task(g.wait_then, args=(str(flag), "done"))

    async def release() -> None:
        await asyncio.sleep(0.05)
        flag.write_text("go")  # runs only if awaiting the ref left the loop free

    async def main() -> tuple[object, None]:
        return await asyncio.gather(ref, release())

    assert asyncio.run(main())[0] == "done"


def test_await_raises_the_tasks_exception(fray_ctx: JobContext) -> None:
    ref = fray_ctx.create_task(h.raise_value_error, args=("boom",))

    async def main() -> object:
        return await ref

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(main())


def test_future_of_a_ref(fray_ctx: JobContext) -> None:
    future = fray_ctx.create_task(h.add, args=(2, 3)).future()
    assert isinstance(future, Future)
    assert future.result(timeout=60) == 5
    failing = fray_ctx.create_task(h.raise_custom, args=("nope",)).future()
    with pytest.raises(h.CustomError, match="nope"):
        failing.result(timeout=60)
    assert fray_ctx.put([1, 2]).future().result(timeout=60) == [1, 2]


def test_as_completed_yields_in_completion_order(fray_ctx: JobContext, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    slow = fray_ctx.create_task(g.wait_then, args=(str(flag), "slow"))
    fast = fray_ctx.create_task(h.add, args=(1, 2))
    failing = fray_ctx.create_task(h.raise_value_error, args=("bad",))
    seen = []
    for ref in fray.as_completed([slow, fast, failing], timeout=120):
        seen.append(ref)
        if len(seen) == 2:
            assert set(seen) == {fast, failing}  # both finished while slow still waits for its flag
            flag.write_text("go")
    assert seen[2] == slow
    assert fray_ctx.get(fast, timeout=60) == 3
    with pytest.raises(ValueError, match="bad"):
        fray_ctx.get(failing, timeout=60)


def test_as_completed_timeout(fray_ctx: JobContext, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    ref = fray_ctx.create_task(g.wait_then, args=(str(flag), 1))
    try:
        with pytest.raises(GetTimeoutError):
            list(fray.as_completed([ref], timeout=0.2))
    finally:
        flag.write_text("go")
    assert list(fray.as_completed([ref], timeout=60)) == [ref]
    assert list(fray.as_completed([])) == []


@requires_capability("async_actors")
def test_async_actor_methods_overlap_up_to_max_concurrency(fray_ctx: JobContext) -> None:
    actor = fray_ctx.create_actor(g.AsyncActor, options=ActorOptions(max_concurrency=3))
    try:
        # each call returns only once 3 calls are inside `meet` at the same time: they must overlap
        assert fray_ctx.get([actor.meet(3) for _ in range(3)], timeout=120) == [3, 3, 3]
        assert fray_ctx.get(actor.add(2, 3), timeout=60) == 5
        with pytest.raises(ValueError, match="async boom"):
            fray_ctx.get(actor.fail("async boom"), timeout=60)
        assert fray_ctx.get(actor.sync_peak(), timeout=60) == 3
    finally:
        fray_ctx.kill(actor)


@requires_capability("async_actors")
def test_async_actor_knows_it_is_an_actor(fray_ctx: JobContext) -> None:
    actor = fray_ctx.create_actor(g.AsyncActor, options=ActorOptions(name=f"async-{id(fray_ctx)}"))
    try:
        assert fray_ctx.get(actor.whoami(), timeout=60) == f"async-{id(fray_ctx)}"
    finally:
        fray_ctx.kill(actor)
