"""Streaming: a generator task or actor method gives one ref per item, in order, as items are produced."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fray import GetTimeoutError, ObjectRef, ObjectRefStream, TaskOptions
from fray.context import JobContext
from fray.testing import group_workloads as g
from fray.testing import requires_capability
from fray.testing.workloads import progress_stopped

STREAM = TaskOptions(streaming=True)


def _open(ctx: JobContext, fn: Callable[..., Any], *args: Any) -> ObjectRefStream:
    stream: Any = ctx.create_task(fn, args=args, options=STREAM)  # a streaming task gives an ObjectRefStream
    assert isinstance(stream, ObjectRefStream), f"streaming=True returned {type(stream).__name__}"
    return stream


@requires_capability("streaming")
def test_stream_task_items_in_order(fray_ctx: JobContext) -> None:
    stream = _open(fray_ctx, g.count_up, 5)
    assert isinstance(stream, ObjectRefStream)
    refs = list(stream)
    assert all(isinstance(r, ObjectRef) for r in refs)
    assert fray_ctx.get(refs, timeout=60) == [0, 1, 2, 3, 4]
    assert list(stream) == []  # ended


@requires_capability("streaming")
def test_first_item_arrives_before_the_generator_finishes(fray_ctx: JobContext, tmp_path: Path) -> None:
    flag = tmp_path / "consumer-saw-first"
    stream = _open(fray_ctx, g.first_then_wait, str(flag))
    first = next(stream)
    assert fray_ctx.get(first, timeout=60) == "first"
    flag.write_text("go")
    assert fray_ctx.get(next(stream), timeout=120) == "second"
    with pytest.raises(StopIteration):
        next(stream)


@requires_capability("streaming")
def test_generator_error_is_raised_by_the_next_item(fray_ctx: JobContext) -> None:
    refs = list(_open(fray_ctx, g.fail_after, 2))
    assert len(refs) == 3
    assert fray_ctx.get(refs[:2], timeout=60) == [0, 1]
    with pytest.raises(ValueError, match="failed after 2 items"):
        fray_ctx.get(refs[2], timeout=60)


@requires_capability("streaming")
def test_breaking_out_early_stops_the_producer(fray_ctx: JobContext, tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    stream = _open(fray_ctx, g.endless, str(progress))
    seen = []
    for ref in stream:
        seen.append(fray_ctx.get(ref, timeout=60))
        if len(seen) == 3:
            break
    assert seen == [0, 1, 2]
    stream.close()
    assert progress_stopped(progress), "the producer kept running after the stream was closed"


@requires_capability("streaming")
def test_stream_items_work_with_wait_and_next_ref_timeout(fray_ctx: JobContext, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    with _open(fray_ctx, g.first_then_wait, str(flag)) as stream:
        first = stream.next_ref(timeout=60)
        assert first is not None
        done, _ = fray_ctx.wait([first], timeout=60)
        assert done == [first]
        with pytest.raises(GetTimeoutError):
            stream.next_ref(timeout=0.2)  # the producer waits for the flag: no next item yet
        flag.write_text("go")
        second = stream.next_ref(timeout=120)
        assert second is not None and fray_ctx.get(second, timeout=60) == "second"


@requires_capability("streaming")
def test_large_items_stream(fray_ctx: JobContext) -> None:
    size = 3 * 2**20
    values = fray_ctx.get(list(_open(fray_ctx, g.large_items, 3, size)), timeout=120)
    assert [len(v) for v in values] == [size] * 3 and [v[0] for v in values] == [0, 1, 2]


@requires_capability("streaming")
def test_actor_method_stream(fray_ctx: JobContext, tmp_path: Path) -> None:
    actor = fray_ctx.create_actor(g.Streamer)
    try:
        stream = actor.numbers.stream(4)
        assert isinstance(stream, ObjectRefStream)
        assert fray_ctx.get(list(stream), timeout=60) == [0, 10, 20, 30]
        flag = tmp_path / "flag"
        stream = actor.first_then_wait.stream(str(flag))
        assert fray_ctx.get(next(stream), timeout=60) == "first"
        flag.write_text("go")
        assert fray_ctx.get(next(stream), timeout=120) == "second"
        refs = list(actor.fail_after.stream(1))
        with pytest.raises(ValueError, match="failed after 1"):
            fray_ctx.get(refs[-1], timeout=60)
        assert fray_ctx.get(actor.count(), timeout=60) == 1  # the actor is fine after streams
    finally:
        fray_ctx.kill(actor)


@requires_capability("streaming")
def test_closing_an_actor_stream_frees_the_actor(fray_ctx: JobContext, tmp_path: Path) -> None:
    actor = fray_ctx.create_actor(g.Streamer)
    try:
        progress = tmp_path / "progress"
        stream = actor.endless.stream(str(progress))
        assert fray_ctx.get(next(stream), timeout=60) == 0
        stream.close()
        assert progress_stopped(progress)
        assert fray_ctx.get(actor.count(), timeout=60) == 0  # its next call runs: the generator gave way
    finally:
        fray_ctx.kill(actor)
