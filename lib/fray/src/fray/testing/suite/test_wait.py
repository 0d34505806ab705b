"""wait: first-completed, partial results on timeout, input order, validation."""

from __future__ import annotations

import time

import pytest

from fray.context import JobContext
from fray.testing import workloads as h


def test_wait_returns_first_completed_not_input_order(fray_ctx: JobContext) -> None:
    slow = fray_ctx.create_task(h.sleep_then, args=(8, "slow"))
    fast = fray_ctx.create_task(h.sleep_then, args=(0.1, "fast"))
    start = time.monotonic()
    done, not_done = fray_ctx.wait([slow, fast], num_returns=1, timeout=30)
    assert time.monotonic() - start < 6.0  # well before the slow one ends, with room for a loaded machine
    assert done == [fast] and done[0] is fast
    assert not_done == [slow] and not_done[0] is slow
    h.drop(fray_ctx, slow)


def test_wait_returns_same_objects_done_in_input_order(fray_ctx: JobContext) -> None:
    refs = [fray_ctx.create_task(h.sleep_then, args=(0.3 - 0.1 * i, i)) for i in range(3)]
    done, not_done = fray_ctx.wait(refs, num_returns=3, timeout=60)
    assert not_done == []
    assert all(a is b for a, b in zip(done, refs, strict=True))


def test_wait_without_timeout_does_not_return_early(fray_ctx: JobContext) -> None:
    ref = fray_ctx.create_task(h.sleep_then, args=(1.0, 1))
    start = time.monotonic()
    done, _ = fray_ctx.wait([ref])
    assert done == [ref]
    assert time.monotonic() - start >= 0.8


def test_wait_timeout_returns_partial_result(fray_ctx: JobContext) -> None:
    fast = fray_ctx.create_task(h.sleep_then, args=(0.05, "fast"))
    slow = fray_ctx.create_task(h.sleep_then, args=(5, "slow"))
    fray_ctx.get(fast, timeout=60)
    start = time.monotonic()
    done, not_done = fray_ctx.wait([fast, slow], num_returns=2, timeout=1.0)
    elapsed = time.monotonic() - start
    assert done == [fast] and not_done == [slow]
    assert 0.8 <= elapsed < 4.5, elapsed  # the timeout, not the slow task's 5 s
    h.drop(fray_ctx, slow)


def test_wait_timeout_zero_polls(fray_ctx: JobContext) -> None:
    slow = fray_ctx.create_task(h.sleep_then, args=(5, "slow"))
    start = time.monotonic()
    done, not_done = fray_ctx.wait([slow], timeout=0)
    assert time.monotonic() - start < 2.0  # a poll, not a wait for the 5 s task
    assert done == [] and not_done == [slow]
    h.drop(fray_ctx, slow)


def test_failed_task_counts_as_done(fray_ctx: JobContext) -> None:
    bad = fray_ctx.create_task(h.raise_value_error, args=("x",))
    done, not_done = fray_ctx.wait([bad], timeout=60)
    assert done == [bad] and not_done == []


def test_wait_edge_cases(fray_ctx: JobContext) -> None:
    assert fray_ctx.wait([]) == ([], [])
    ref = fray_ctx.create_task(h.add, args=(1, 1))
    assert fray_ctx.wait([ref], num_returns=5, timeout=60) == ([ref], [])  # clamped to len(refs)
    with pytest.raises(ValueError):
        fray_ctx.wait([ref], num_returns=0)
    with pytest.raises(ValueError):
        fray_ctx.wait([ref, ref])
    with pytest.raises(ValueError):
        fray_ctx.wait([ref, 42])  # type: ignore[list-item]


def test_wait_num_returns_caps_done(fray_ctx: JobContext) -> None:
    refs = [fray_ctx.put(i) for i in range(4)]
    done, not_done = fray_ctx.wait(refs, num_returns=2, timeout=60)
    assert len(done) == 2 and len(not_done) == 2
    assert set(map(id, done + not_done)) == set(map(id, refs))
