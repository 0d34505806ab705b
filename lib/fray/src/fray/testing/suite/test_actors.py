"""Actors: state, order, concurrency, names, get_if_exists atomicity, kill, handles in tasks."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from fray import ActorAlreadyExistsError, ActorDiedError, ActorNotFoundError, ActorOptions
from fray.context import JobContext
from fray.testing import workloads as h


def _name() -> str:
    return f"actor-{uuid.uuid4().hex[:8]}"


def test_actor_state_persists_and_calls_run_in_order(fray_ctx: JobContext) -> None:
    counter = fray_ctx.create_actor(h.Counter, args=(10,))
    for i in range(100):
        counter.append(i)
    assert fray_ctx.get(counter.items(), timeout=60) == list(range(100))
    assert fray_ctx.get([counter.incr(1), counter.incr(2)], timeout=60) == [11, 13]
    assert fray_ctx.get(counter.incr(by=3), timeout=60) == 16


def test_unknown_method_is_an_attribute_error(fray_ctx: JobContext) -> None:
    counter = fray_ctx.create_actor(h.Counter)
    with pytest.raises(AttributeError, match="no_such_method"):
        counter.no_such_method()


def test_unnamed_actors_are_independent(fray_ctx: JobContext) -> None:
    a, b = fray_ctx.create_actor(h.Counter), fray_ctx.create_actor(h.Counter)
    fray_ctx.get(a.incr(5), timeout=60)
    assert fray_ctx.get(b.get(), timeout=60) == 0


def test_get_if_exists_returns_the_same_actor(fray_ctx: JobContext) -> None:
    name = _name()
    first = fray_ctx.create_actor(h.Counter, options=ActorOptions(name=name, get_if_exists=True))
    fray_ctx.get(first.incr(5), timeout=60)
    second = fray_ctx.create_actor(h.Counter, options=ActorOptions(name=name, get_if_exists=True))
    assert fray_ctx.get(second.get(), timeout=60) == 5
    assert fray_ctx.get(fray_ctx.get_actor(name).get(), timeout=60) == 5


def test_get_if_exists_is_atomic_for_racing_creators(fray_ctx: JobContext) -> None:
    name = _name()
    handles = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        handles.append(fray_ctx.create_actor(h.Counter, options=ActorOptions(name=name, get_if_exists=True)))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(handles) == 8
    fray_ctx.get([handle.incr() for handle in handles], timeout=60)
    assert fray_ctx.get(handles[0].get(), timeout=60) == 8


def test_get_if_exists_is_atomic_across_workers(fray_ctx: JobContext) -> None:
    name = _name()
    refs = [fray_ctx.create_task(h.named_counter_incr, args=(name,)) for _ in range(4)]
    assert sorted(fray_ctx.get(refs, timeout=120)) == [1, 2, 3, 4]


def test_taken_name_without_get_if_exists_is_refused(fray_ctx: JobContext) -> None:
    name = _name()
    fray_ctx.create_actor(h.Counter, options=ActorOptions(name=name))
    with pytest.raises(ActorAlreadyExistsError):
        fray_ctx.create_actor(h.Counter, options=ActorOptions(name=name))


def test_get_actor_of_unknown_name(fray_ctx: JobContext) -> None:
    with pytest.raises(ActorNotFoundError):
        fray_ctx.get_actor(_name())


def test_kill_then_calls_fail_and_name_is_freed(fray_ctx: JobContext) -> None:
    name = _name()
    counter = fray_ctx.create_actor(h.Counter, options=ActorOptions(name=name))
    assert fray_ctx.get(counter.incr(), timeout=60) == 1
    fray_ctx.kill(counter)
    with pytest.raises(ActorDiedError):
        fray_ctx.get(counter.incr(), timeout=30)
    with pytest.raises(ActorNotFoundError):
        fray_ctx.get_actor(name)
    again = fray_ctx.create_actor(h.Counter, options=ActorOptions(name=name))
    assert fray_ctx.get(again.incr(), timeout=60) == 1


def test_failing_init_makes_calls_raise_actor_died(fray_ctx: JobContext) -> None:
    actor = fray_ctx.create_actor(h.FailingInit)
    with pytest.raises(ActorDiedError, match="init exploded"):
        fray_ctx.get(actor.ping(), timeout=60)


def test_max_concurrency_lets_calls_overlap(fray_ctx: JobContext) -> None:
    serial = fray_ctx.create_actor(h.Counter)
    parallel = fray_ctx.create_actor(h.Counter, options=ActorOptions(max_concurrency=2))
    fray_ctx.get([serial.get(), parallel.get()], timeout=60)  # both started
    # each call returns True only if the other call is inside at the same time: they overlap
    assert fray_ctx.get([parallel.meet(2), parallel.meet(2)], timeout=120) == [True, True]
    start = time.monotonic()
    fray_ctx.get([serial.sleep(0.5), serial.sleep(0.5)], timeout=60)
    in_turn = time.monotonic() - start
    assert in_turn >= 0.95, in_turn  # a lower bound: a slow machine cannot fail it


def test_actor_handle_passed_into_a_task(fray_ctx: JobContext) -> None:
    counter = fray_ctx.create_actor(h.Counter)
    assert fray_ctx.get(fray_ctx.create_task(h.call_actor, args=(counter, 5)), timeout=60) == 5
    assert fray_ctx.get(counter.get(), timeout=60) == 5


def test_actor_submits_nested_task(fray_ctx: JobContext) -> None:
    counter = fray_ctx.create_actor(h.Counter)
    assert fray_ctx.get(counter.submit_task(2, 3), timeout=60) == 5


def test_ref_argument_to_actor_arrives_as_value(fray_ctx: JobContext) -> None:
    counter = fray_ctx.create_actor(h.Counter)
    assert fray_ctx.get(counter.incr(fray_ctx.put(7)), timeout=60) == 7
    assert fray_ctx.get(counter.incr(fray_ctx.create_task(h.add, args=(1, 2))), timeout=60) == 10


def test_50_actors(fray_ctx: JobContext) -> None:
    actors = [fray_ctx.create_actor(h.Counter, args=(i,)) for i in range(50)]
    assert fray_ctx.get([a.incr() for a in actors], timeout=240) == [i + 1 for i in range(50)]
    for actor in actors:
        fray_ctx.kill(actor)
