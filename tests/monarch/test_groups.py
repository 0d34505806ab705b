"""Monarch-native actor groups: one actor mesh over the group's own processes, one broadcast per group call,
the per-member fallback after a restart; streams consumed inside a task. (Placement and SPMD over several hosts:
test_multihost.py, on namespaced hosts.)"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fray
from fray import ActorOptions, ActorUnavailableError, TaskOptions
from fray.registry import get_backend, job_context_from, parse_spec
from fray_monarch.driver import group_rec, processes


class Caster:
    """Reports how Monarch delivered the message it is answering: the size of the mesh (slice) it was cast to."""

    def cast_size(self) -> dict[str, int]:
        from monarch.actor import current_size

        return dict(current_size())

    def where(self) -> tuple[int, int, str | None]:
        return fray.current_actor().rank, os.getppid(), os.environ.get("LOCAL_RANK")

    def pid(self) -> int:
        return os.getpid()

    def crash(self) -> None:
        os._exit(1)


@pytest.fixture(scope="module")
def ctx() -> Iterator[Any]:
    """One context for the module's tests: each kills what it made, and the next checks that nothing is left."""
    context = job_context_from(get_backend("monarch"), parse_spec("monarch?procs=2")[1])
    try:
        with fray.using(context):
            yield context
    finally:
        context.shutdown()


@pytest.fixture
def broadcasts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many Monarch casts each group call made (the mesh slices it was sent to)."""
    seen: list[int] = []
    original = group_rec.Block.targets

    def counting(self: group_rec.Block, indices: list[int]) -> list[Any]:
        targets = original(self, indices)
        seen.append(len(targets))
        return targets

    monkeypatch.setattr(group_rec.Block, "targets", counting)
    return seen


def test_group_call_is_one_broadcast_to_one_mesh(ctx: Any, broadcasts: list[int]) -> None:
    group = ctx.create_actor_group(Caster, 4)
    try:
        assert ctx.get(group.cast_size(), timeout=120) == [{"procs": 4}] * 4  # every member got the same cast
        assert broadcasts == [1]
        pids = ctx.get(group.pid(), timeout=60)
        assert len(set(pids)) == 4 and os.getpid() not in pids  # a process of its own per member
        assert ctx.get(group[1:3].cast_size(), timeout=60) == [{"procs": 2}] * 2  # a slice: one cast to it
        assert ctx.get(group[[3, 0]].cast_size(), timeout=60) == [{}, {}]  # not a range: one cast per member
        assert ctx.get(group[2].cast_size(), timeout=60) == {}  # a handle: a message of its own
    finally:
        ctx.kill(group)


def test_restarted_member_is_served_by_its_own_send(ctx: Any, broadcasts: list[int]) -> None:
    group = ctx.create_actor_group(Caster, 3, options=ActorOptions(max_restarts=1))
    try:
        before = ctx.get(group[1].pid(), timeout=120)
        with pytest.raises(ActorUnavailableError):
            ctx.get(group[1].crash(), timeout=60)
        deadline = time.monotonic() + 60
        while True:
            try:
                sizes = ctx.get(group.cast_size(), timeout=60)
                break
            except ActorUnavailableError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        # ranks 0 and 2 stay on the group's mesh (a cast each: 0 and 2 are no range); rank 1 has a process and a
        # one-process mesh of its own, reached by a call of its own
        assert sizes == [{}, {"procs": 1}, {}]
        assert broadcasts[-1] == 2
        assert ctx.get(group[1].pid(), timeout=60) != before
        assert [w[0] for w in ctx.get(group.where(), timeout=60)] == [0, 1, 2]
    finally:
        ctx.kill(group)


@pytest.mark.parametrize("distributed", [True, False], ids=["spmd", "plain"])
def test_a_group_call_made_after_a_members_call_failed_at_its_death_waits_for_the_restart(
    ctx: Any, monkeypatch: pytest.MonkeyPatch, distributed: bool
) -> None:
    """A member's call can fail at its process's death (Monarch fails the call) before fray's news of that death
    lands: the news comes from fray's watch of the process, or from its pid once the worker's first answer gave it,
    and on a loaded machine that answer can come seconds late. A call to the group made in between is made after
    the death: it waits for the restart (the whole SPMD group's, or the member's own in a plain group), as the docs'
    table says, and is not failed as one in flight."""
    delayed: list[threading.Timer] = []
    died = processes.ProcessPool._died

    def late_news(self: processes.ProcessPool, proc: Any, value: Any, exc: BaseException | None) -> None:
        timer = threading.Timer(1.0, died, (self, proc, value, exc))
        delayed.append(timer)
        timer.start()

    monkeypatch.setattr(processes.ProcessPool, "_watch_pid", lambda self, proc, reply, exc: None)  # pid unknown
    monkeypatch.setattr(processes.ProcessPool, "_died", late_news)
    group = ctx.create_actor_group(Caster, 2, options=ActorOptions(max_restarts=1), distributed=distributed)
    try:
        before = ctx.get(group.pid(), timeout=120)
        with pytest.raises(ActorUnavailableError):
            ctx.get(group[1].crash(), timeout=60)  # in flight at the death
        after = ctx.get(group.pid(), timeout=120)  # made after it: waits for the restart
        restarted = [0, 1] if distributed else [1]
        assert [r for r in (0, 1) if after[r] != before[r]] == restarted
    finally:
        ctx.kill(group)
        for timer in delayed:
            timer.join()


def test_group_members_count_against_the_hosts_cpus() -> None:
    ctx = fray.init("monarch?procs=2&cpus=2")
    try:
        group = ctx.create_actor_group(Caster, 2, options=ActorOptions(resources={"CPU": 1}))
        ctl = ctx.ctl  # type: ignore[attr-defined]
        general = [p for p in ctl.pool.procs if p.general]
        assert sum(p.free_capacity.get("CPU", 0.0) for p in general) == pytest.approx(0.0)
        ctx.kill(group)
        assert sum(p.free_capacity.get("CPU", 0.0) for p in general) == pytest.approx(2.0)
    finally:
        fray.shutdown()


def squares(n: int) -> Any:
    for i in range(n):
        yield i * i


def endless() -> Any:
    i = 0
    while True:
        yield i
        i += 1


def consume_streams(n: int) -> tuple[list[int], int]:
    """A stream consumed inside a task (through the coordinator), and one closed early there."""
    ctx = fray.get_job_context()
    streamed = ctx.create_task(squares, args=(n,), options=TaskOptions(streaming=True))
    values = [ctx.get(ref, timeout=60) for ref in streamed]
    stream = ctx.create_task(endless, options=TaskOptions(streaming=True))
    first = ctx.get(next(stream), timeout=60)
    stream.close()
    return values, first


def test_stream_consumed_inside_a_task(ctx: Any) -> None:
    assert ctx.get(ctx.create_task(consume_streams, args=(4,)), timeout=120) == ([0, 1, 4, 9], 0)
    deadline = time.monotonic() + 30
    while ctx.ctl.streams.by_id and time.monotonic() < deadline:  # every stream ended and closed: nothing kept
        time.sleep(0.1)
    assert not ctx.ctl.streams.by_id


class Member:
    def __init__(self) -> None:
        self.me = fray.current_actor()

    def rank(self) -> int:
        return self.me.rank

    def items(self, n: int) -> Any:
        for i in range(n):
            yield self.me.rank, i


def group_inside_a_task(n: int) -> tuple[list[int], list[tuple[int, int]]]:
    """A group created, called (a broadcast and a member's stream) and killed from inside a task."""
    ctx = fray.get_job_context()
    group = ctx.create_actor_group(Member, n)
    try:
        return ctx.get(group.rank(), timeout=60), ctx.get(list(group[1].items.stream(2)), timeout=60)
    finally:
        ctx.kill(group)


def test_group_created_and_used_inside_a_task(ctx: Any) -> None:
    assert ctx.get(ctx.create_task(group_inside_a_task, args=(3,)), timeout=180) == ([0, 1, 2], [(1, 0), (1, 1)])
    assert not ctx.ctl.groups.by_id and all(p.general for p in ctx.ctl.pool.procs)  # its processes are gone


class AsyncItems:
    async def items(self, n: int) -> Any:
        import asyncio

        for i in range(n):
            await asyncio.sleep(0)
            yield i


def test_async_generator_method_streams(ctx: Any) -> None:
    actor = ctx.create_actor(AsyncItems)
    try:
        assert ctx.get(list(actor.items.stream(3)), timeout=60) == [0, 1, 2]
    finally:
        ctx.kill(actor)
