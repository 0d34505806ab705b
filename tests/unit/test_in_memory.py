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


def _plus_one(x: int) -> int:
    return x + 1


def _fan(n: int) -> int:
    inner = fray.get_job_context()
    return sum(inner.get([inner.create_task(_plus_one, args=(i,)) for i in range(n)], timeout=60))


@pytest.mark.parametrize("cpus", [1, 2])
def test_work_submitted_while_every_cpu_is_taken_always_runs(cpus: int) -> None:
    """Work submitted while its resources are all taken is staged without the ledger's lock and started by the
    next release (or by its submitter, if the resources freed meanwhile): from several threads at once, with
    tasks that submit and wait for their own, none is left waiting."""
    with fray.init(f"in_memory?cpus={cpus}") as ctx:
        results: list[int] = []
        lock = threading.Lock()

        def submit_many() -> None:
            refs = [ctx.create_task(_plus_one, args=(i,)) for i in range(1500)]
            refs += [ctx.create_task(_fan, args=(20,)) for _ in range(20)]
            got = ctx.get(refs, timeout=120)
            with lock:
                results.append(sum(got))

        threads = [threading.Thread(target=submit_many) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=150)
        expected = sum(range(1, 1501)) + 20 * sum(range(1, 21))
        assert results == [expected] * 4


def test_work_staged_just_after_the_last_release_still_starts() -> None:
    """The race a staged submission must survive, made to happen: submit looks, its CPU is taken; the only work
    holding it releases it (draining nothing: the new work is not staged yet); then the work is staged. Nothing
    would release again, so submit itself must start it."""
    from fray.kit.ledger import Ledger, signature

    ledger = Ledger({"CPU": 1.0})
    request = signature({"CPU": 1.0})
    ran = threading.Event()
    ledger.submit(request, lambda: None)  # takes the CPU (a worker runs it and does not release: we do, below)
    looks = ledger._fits

    def fits_then_release(req: tuple[tuple[str, float], ...]) -> bool:
        answer = looks(req)
        if not answer and not ran.is_set() and not getattr(fits_then_release, "done", False):
            fits_then_release.done = True  # type: ignore[attr-defined]
            assert ledger.release(request) is None  # the last release, before the work below is staged
        return answer

    ledger._fits = fits_then_release  # type: ignore[method-assign]

    def work() -> None:
        ran.set()
        ledger.release(request)

    ledger.submit(request, work)
    assert ran.wait(10), "the work was staged after the last release and never started"
    ledger.close()


def test_nested_tasks_do_not_deadlock_on_one_cpu() -> None:
    with fray.init("in_memory?cpus=1") as ctx:

        def level(n: int) -> int:
            inner = fray.get_job_context()
            return n if n == 0 else inner.get(inner.create_task(level, args=(n - 1,)), timeout=30) + 1

        assert ctx.get(ctx.create_task(level, args=(10,), options=TaskOptions()), timeout=30) == 10
