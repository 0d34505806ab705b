"""in_memory specifics the shared suite cannot state for every backend."""

from __future__ import annotations

import threading
import time

import pytest

import fray
from fray import ActorOptions, Lifetime, TaskOptions


def test_cpu_slots_limit_concurrency_and_blocked_tasks_release_them() -> None:
    with fray.init("in_memory?cpus=2&serialize=false") as ctx:  # the task closes over a lock
        running, peak, lock = [0], [0], threading.Lock()

        def busy() -> None:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.1)
            with lock:
                running[0] -= 1

        ctx.get([ctx.create_task(busy) for _ in range(8)], timeout=30)
        assert peak[0] == 2


def test_serialize_off_passes_objects_by_reference() -> None:
    with fray.init("in_memory?serialize=false") as ctx:
        lock = threading.Lock()
        assert ctx.get(ctx.create_task(lambda x: x, args=(lock,)), timeout=10) is lock


def test_detached_actor_outlives_its_context() -> None:
    first = fray.init("in_memory?namespace=detached-test")
    actor = first.create_actor(dict, options=ActorOptions(name="survivor", lifetime=Lifetime.DETACHED))
    first.get(actor.update({"k": 1}), timeout=10)
    first.shutdown()
    second = fray.init("in_memory?namespace=detached-test")
    try:
        assert second.get(second.get_actor("survivor").get("k"), timeout=10) == 1
        second.kill(second.get_actor("survivor"))
    finally:
        fray.shutdown()


def test_actor_resources_are_held_for_its_life() -> None:
    with fray.init("in_memory?cpus=1") as ctx:
        holder = ctx.create_actor(dict, options=ActorOptions(resources={"CPU": 1}))
        ctx.get(holder.get("x"), timeout=10)
        ref = ctx.create_task(lambda: "ran")
        assert ctx.wait([ref], timeout=0.3) == ([], [ref])  # the actor holds the only CPU
        ctx.kill(holder)
        assert ctx.get(ref, timeout=10) == "ran"


def test_shutdown_cancels_queued_tasks() -> None:
    ran: list[str] = []
    ctx = fray.init("in_memory?cpus=1&serialize=false")
    ctx.create_task(time.sleep, args=(0.5,))
    queued = ctx.create_task(lambda: ran.append("ran"))
    ctx.shutdown()
    assert queued.payload.outcome.done()  # finished (cancelled) at shutdown, without running
    time.sleep(1.0)
    assert ran == []
    with pytest.raises(fray.FrayError, match="shut down"):  # and the context refuses every later call
        ctx.get(queued, timeout=10)


def test_nested_tasks_do_not_deadlock_on_one_cpu() -> None:
    with fray.init("in_memory?cpus=1") as ctx:

        def level(n: int) -> int:
            inner = fray.get_job_context()
            return n if n == 0 else inner.get(inner.create_task(level, args=(n - 1,)), timeout=30) + 1

        assert ctx.get(ctx.create_task(level, args=(10,), options=TaskOptions()), timeout=30) == 10
