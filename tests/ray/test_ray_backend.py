"""Ray-specific behaviour beyond the conformance suite, on real Ray (no mocks)."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

pytest.importorskip("fray_ray")

import fray
from fray import ActorOptions, TaskOptions
from fray.context import get_job_context
from fray.errors import RemoteExceptionProxy
from fray_ray import RayJobContext
from fray_ray.job import _registry

HEDGED_DRIVER = Path(__file__).with_name("_hedged_cancel_driver.py")


def nest(depth: int) -> int:
    if depth == 0:
        return 0
    c = get_job_context()
    return 1 + int(c.get(c.create_task(nest, args=(depth - 1,)), timeout=120))


def test_ten_levels_of_nesting_do_not_deadlock(ctx: RayJobContext) -> None:
    assert ctx.get(ctx.create_task(nest, args=(10,)), timeout=240) == 10


def context_type() -> str:
    return type(get_job_context()).__name__


class Probe:
    def context_type(self) -> str:
        return type(get_job_context()).__name__


def test_context_is_set_in_tasks_and_actors(ctx: RayJobContext) -> None:
    assert ctx.get(ctx.create_task(context_type), timeout=60) == "RayJobContext"
    assert ctx.get(ctx.create_actor(Probe).context_type(), timeout=60) == "RayJobContext"


def square(x: int) -> int:
    return x * x


def test_function_is_registered_once(ctx: RayJobContext) -> None:
    ctx.get([ctx.create_task(square, args=(i,)) for i in range(5)], timeout=60)
    first = _registry.lookup(square)
    ctx.get(ctx.create_task(square, args=(3,)), timeout=60)
    assert _registry.lookup(square) is first


class Holder:
    def __init__(self) -> None:
        self.payload = bytearray(1000)

    def size(self, extra: int) -> int:
        return len(self.payload) + extra

    def count(self, n: int) -> object:
        yield from range(n)

    def __call__(self, extra: int) -> int:
        return self.size(extra)


def test_a_bound_method_or_callable_task_does_not_keep_its_object(ctx: RayJobContext) -> None:
    """The registration cache keeps a registration per function, not the object a bound method is bound to."""
    holder = Holder()
    alive = weakref.ref(holder)
    assert ctx.get(ctx.create_task(holder.size, args=(1,)), timeout=60) == 1001
    assert ctx.get(ctx.create_task(holder.size, args=(2,)), timeout=60) == 1002
    assert ctx.get(ctx.create_task(holder, args=(3,)), timeout=60) == 1003
    stream = ctx.create_task(holder.count, args=(3,), options=TaskOptions(streaming=True))
    assert [ctx.get(ref, timeout=60) for ref in stream] == [0, 1, 2]
    del holder, stream
    gc.collect()
    assert alive() is None, "a task of a bound method or callable object kept its object alive after it ended"


class Unpicklable(Exception):
    def __init__(self, a: str, b: int) -> None:
        super().__init__(a)
        self.b = b


def raise_unpicklable() -> None:
    raise Unpicklable("custom message", 2)


def test_exception_that_cannot_travel_becomes_a_named_proxy(ctx: RayJobContext) -> None:
    with pytest.raises(RemoteExceptionProxy, match="Unpicklable: custom message"):
        ctx.get(ctx.create_task(raise_unpicklable), timeout=60)


def sleep_then(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


def identity(x: int) -> int:
    return x


def test_cancel_of_task_waiting_on_args_does_not_crash_the_driver(ctx: RayJobContext) -> None:
    # Ray 2.60 aborts the driver here unless fray defers ray.cancel until the arguments are ready.
    blocker = ctx.create_task(sleep_then, args=(1.0, 7))
    waiting = ctx.create_task(identity, args=(blocker,))
    ctx.cancel(waiting)
    done, _ = ctx.wait([waiting], timeout=0)
    assert done == [waiting]
    with pytest.raises(fray.TaskCancelledError):
        ctx.get(waiting, timeout=30)
    assert ctx.get(blocker, timeout=30) == 7
    time.sleep(1.5)  # past the point where the deferred cancel reaches Ray
    assert ctx.get(ctx.create_task(identity, args=(blocker,)), timeout=30) == 7


def test_cancelling_tasks_that_finish_together_does_not_crash_the_driver(tmp_path: Path) -> None:
    # Ray 2.60 aborts the driver when a cancel meets a task whose reply it is processing; taking the first of
    # eight like tasks and cancelling the rest hit that within a few hundred rounds before fray deferred cancels.
    done = subprocess.run(
        [sys.executable, str(HEDGED_DRIVER), "400"], capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert done.returncode == 0 and done.stdout.startswith("OK"), (
        f"the driver ended with {done.returncode}: {done.stdout[-500:]} {done.stderr[-3000:]}"
    )


def test_a_cancelled_refs_mark_goes_with_the_ref(ctx: RayJobContext) -> None:
    ref = ctx.create_task(sleep_then, args=(1.0, 7))
    key = ref.payload.binary()
    ctx.cancel(ref)
    assert key in ctx._cancels.cancelled  # (get raises TaskCancelledError before Ray is told)
    del ref
    gc.collect()
    assert key not in ctx._cancels.cancelled  # a driver that cancels often does not grow


def test_deferred_cancels_share_one_thread(ctx: RayJobContext) -> None:
    blocker = ctx.create_task(sleep_then, args=(2.0, 7))
    waiting = [ctx.create_task(identity, args=(blocker,)) for _ in range(20)]
    threads = threading.active_count()
    for ref in waiting:
        ctx.cancel(ref)
    assert threading.active_count() <= threads + 1  # one deferred-cancel thread per context, not one per ref
    for ref in waiting:
        with pytest.raises(fray.TaskCancelledError):
            ctx.get(ref, timeout=30)
    assert ctx.get(blocker, timeout=30) == 7
    deadline = time.monotonic() + 10
    while ctx._cancels._thread is not None and time.monotonic() < deadline:  # every cancel has reached Ray
        time.sleep(0.05)
    assert ctx._cancels._thread is None
    assert ctx.get(ctx.create_task(identity, args=(blocker,)), timeout=30) == 7


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n


def make_named(name: str) -> int:
    c = get_job_context()
    return int(c.get(c.create_actor(Counter, options=ActorOptions(name=name)).incr(), timeout=60))


def test_named_actor_made_in_a_task_outlives_the_task(ctx: RayJobContext) -> None:
    assert ctx.get(ctx.create_task(make_named, args=("made-in-task",)), timeout=60) == 1
    time.sleep(1.0)
    assert ctx.get(ctx.get_actor("made-in-task").incr(), timeout=60) == 2


def test_options_map_to_ray(ctx: RayJobContext) -> None:
    opts = TaskOptions(resources={"CPU": 0.5}, name="mapped", max_calls=2, max_retries=0, retry_exceptions=[KeyError])
    assert ctx.get([ctx.create_task(square, args=(i,), options=opts) for i in range(4)], timeout=60) == [0, 1, 4, 9]
    with pytest.raises(fray.InfeasibleResourcesError):
        ctx.create_task(square, args=(1,), options=TaskOptions(resources={"no_such_resource": 1}))


def test_a_call_right_after_kill_fails_every_time(ctx: RayJobContext) -> None:
    """ray.kill is asynchronous; a call made right after it could reach the live worker and succeed (before the
    fix, this test failed every run). fray's kill returns once this driver sees the actor dead."""
    group = ctx.create_actor_group(Probe, 8)
    ctx.get(group.context_type(), timeout=120)
    for member in group:
        ctx.kill(member)
        with pytest.raises(fray.ActorDiedError):
            ctx.get(member.context_type(), timeout=60)


def test_completions_are_collected_in_rounds_not_one_per_round(ctx: RayJobContext) -> None:
    refs = [ctx.create_task(identity, args=(i,)) for i in range(300)]
    assert ctx.get(refs, timeout=120) == list(range(300))
    rounds: list[int] = []
    wait = ctx._wait

    def counted(refs_: list[fray.ObjectRef], num_returns: int, timeout: float | None) -> set[int]:
        rounds.append(len(refs_))
        return wait(refs_, num_returns, timeout)

    ctx._wait = counted  # type: ignore[method-assign]
    try:
        assert sorted(fray.as_completed(refs, timeout=60), key=refs.index) == refs
        assert len(rounds) <= 3  # the watcher's _wait returns every completed ref (Ray's wait gives num_returns)
        done, rest = ctx.wait(refs, num_returns=2, timeout=10)
        assert done == refs[:2] and rest == refs[2:]  # the public wait still gives num_returns, in input order
    finally:
        del ctx._wait


def _worker_start() -> tuple[str, str, str]:
    """What a Ray worker of this context started with: its job's runtime_env, fray's GPU variable, PYTHONPATH."""
    import os

    import ray

    runtime_env = ray.get_runtime_context().get_runtime_env_string()
    return runtime_env, os.environ.get("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", ""), os.environ.get("PYTHONPATH", "")


def test_a_private_instances_workers_start_without_a_runtime_env_and_with_the_drivers_paths(
    ctx: RayJobContext,
) -> None:
    """A job runtime_env makes Ray start every worker through its runtime_env setup, a second Python start (twice a
    worker's CPU), and leaves the workers it prestarted unused: a private instance's workers get fray's variable
    and the driver's paths from the raylet's environment instead."""
    import os

    runtime_env, accel, path = ctx.get(ctx.create_task(_worker_start), timeout=60)
    assert runtime_env in ("", "{}"), runtime_env
    assert accel == "1"
    assert os.path.dirname(os.path.abspath(__file__)) in path.split(os.pathsep), path
