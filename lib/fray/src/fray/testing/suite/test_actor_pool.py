"""ctx.actor_pool: stateful members fed by map/submit, bounded and ordered, and what a member's death does."""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from pathlib import Path

import pytest

from fray.actor_pool import PoolMemberLostError
from fray.context import JobContext
from fray.runtime.refs import ActorHandle, ObjectRef
from fray.testing import executor_workloads as w
from fray.testing import requires_capability

TIMEOUT = 120.0


def test_actor_pool_map_in_order_over_its_members(fray_ctx: JobContext) -> None:
    with fray_ctx.actor_pool(w.Doubler, 3, 10) as pool:
        assert len(pool) == 3
        assert list(pool.map("double", range(12))) == [i * 10 for i in range(12)]
        calls = [fray_ctx.get(member.double(0), timeout=TIMEOUT) for member in pool.actors]
        assert calls == [0, 0, 0]  # each member made once, with the pool's arguments (state kept)
        assert sorted(pool.map("double", range(6), ordered=False)) == [i * 10 for i in range(6)]


def test_actor_pool_submit_and_callable_target(fray_ctx: JobContext) -> None:
    with fray_ctx.actor_pool(w.Doubler, 2) as pool:
        future = pool.submit("double", 21)
        assert isinstance(future, Future) and future.result(TIMEOUT) == 42

        def call(handle: ActorHandle, item: int) -> ObjectRef:
            return handle.double(item)  # type: ignore[no-any-return]

        assert list(pool.map(call, [1, 2, 3])) == [2, 4, 6]


def test_actor_pool_map_is_lazy_and_bounded(fray_ctx: JobContext) -> None:
    read = [0]

    def items() -> object:
        for i in itertools.count():
            read[0] = i + 1
            yield i

    with fray_ctx.actor_pool(w.Doubler, 2) as pool:
        results = pool.map("double", items(), max_in_flight=3)  # type: ignore[arg-type]
        taken = []
        for value in results:
            taken.append(value)
            assert read[0] - len(taken) <= 3
            if len(taken) == 20:
                break
        assert taken == [i * 2 for i in range(20)]


def test_actor_pool_error_names_the_item_and_checks_arguments(fray_ctx: JobContext) -> None:
    with fray_ctx.actor_pool(w.Doubler, 2) as pool:
        with pytest.raises(ValueError, match="item 3 is bad") as info:
            list(pool.map("fail_at", range(6)))
        assert info.value.item_index == 3  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="max_in_flight"):
            pool.map("double", [1], max_in_flight=0)
        with pytest.raises(TypeError):
            pool.map(42, [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size"):
        fray_ctx.actor_pool(w.Doubler, 0)
    with pytest.raises(ValueError, match="name"):
        fray_ctx.actor_pool(w.Doubler, 2, name="shared")


def test_actor_pool_member_killed_names_the_lost_items(fray_ctx: JobContext) -> None:
    with fray_ctx.actor_pool(w.Doubler, 2) as pool:
        fray_ctx.kill(pool.actors[0])  # killed: no restart, whatever its options
        with pytest.raises(PoolMemberLostError) as info:
            list(pool.map("double", range(4)))
        assert info.value.member == 0 and 0 in info.value.lost_items, info.value


@requires_capability("process_isolation")
def test_actor_pool_member_death_without_restarts_names_the_lost_items(fray_ctx: JobContext, tmp_path: Path) -> None:
    pool = fray_ctx.actor_pool(w.Doubler, 2, 2, str(tmp_path / "died"))
    try:
        with pytest.raises(PoolMemberLostError) as info:
            list(pool.map("maybe_die", range(6), max_in_flight=4))
        assert 0 in info.value.lost_items, info.value
        assert "max_restarts is 0" in str(info.value)
    finally:
        pool.shutdown()


@requires_capability("process_isolation")
def test_actor_pool_member_death_with_restarts_retries_its_items(fray_ctx: JobContext, tmp_path: Path) -> None:
    pool = fray_ctx.actor_pool(w.Doubler, 2, 2, str(tmp_path / "died"), max_restarts=1)
    try:
        assert list(pool.map("maybe_die", range(6), max_in_flight=4)) == [0, 2, 4, 6, 8, 10]
        assert (tmp_path / "died").exists()  # a member did die on the way
    finally:
        pool.shutdown()
