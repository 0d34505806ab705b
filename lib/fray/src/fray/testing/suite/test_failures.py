"""Crashes and cancellation: contained, reported as the right error, retried or restarted as asked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fray import (
    ActorDiedError,
    ActorOptions,
    ActorUnavailableError,
    TaskCancelledError,
    TaskOptions,
    WorkerCrashedError,
)
from fray.context import JobContext
from fray.testing import requires_capability
from fray.testing import workloads as h


def test_cancel_task_that_has_not_started(fray_ctx: JobContext) -> None:
    blocker = fray_ctx.create_task(h.sleep_then, args=(2, "upstream"))
    waiting = fray_ctx.create_task(h.identity, args=(blocker,))  # cannot start before blocker ends
    fray_ctx.cancel(waiting)
    with pytest.raises(TaskCancelledError):
        fray_ctx.get(waiting, timeout=60)
    assert fray_ctx.get(blocker, timeout=60) == "upstream"


def test_cancel_of_finished_task_keeps_result(fray_ctx: JobContext) -> None:
    ref = fray_ctx.create_task(h.add, args=(1, 1))
    assert fray_ctx.get(ref, timeout=60) == 2
    fray_ctx.cancel(ref)
    assert fray_ctx.get(ref, timeout=60) == 2


@requires_capability("cancel_running")
def test_cancel_running_task(fray_ctx: JobContext, tmp_path: Path) -> None:
    marker = str(tmp_path / "started")
    ref = fray_ctx.create_task(h.spin, args=(marker, 60))
    h.wait_for_file(marker, 60)
    start = time.monotonic()
    fray_ctx.cancel(ref)
    with pytest.raises(TaskCancelledError):
        fray_ctx.get(ref, timeout=30)
    assert time.monotonic() - start < 15


@requires_capability("process_isolation")
def test_crashed_task_raises_worker_crashed(fray_ctx: JobContext) -> None:
    cursor = fray_ctx.events().page().cursor
    ref = fray_ctx.create_task(h.crash, options=TaskOptions(max_retries=0))
    with pytest.raises(WorkerCrashedError):
        fray_ctx.get(ref, timeout=60)
    assert fray_ctx.get(fray_ctx.create_task(h.add, args=(1, 1)), timeout=60) == 2  # the context still works
    died = h.recorded_after(fray_ctx, cursor, "worker.died")
    assert died is not None and died.get("reason"), (
        "the worker's death is an event (fray.telemetry.events), with its reason"
    )


@requires_capability("process_isolation")
def test_crashed_task_is_retried(fray_ctx: JobContext, tmp_path: Path) -> None:
    ref = fray_ctx.create_task(h.crash_first, args=(str(tmp_path / "count"),), options=TaskOptions(max_retries=1))
    assert fray_ctx.get(ref, timeout=120) == "ok after 1 crash"


@requires_capability("process_isolation")
def test_crashed_actor_raises_actor_died(fray_ctx: JobContext) -> None:
    cursor = fray_ctx.events().page().cursor
    actor = fray_ctx.create_actor(h.Counter)
    assert fray_ctx.get(actor.incr(), timeout=60) == 1
    with pytest.raises(ActorDiedError):
        fray_ctx.get(actor.crash(), timeout=60)
    with pytest.raises(ActorDiedError):
        fray_ctx.get(actor.incr(), timeout=60)
    died = h.recorded_after(fray_ctx, cursor, "actor.died", "Counter")
    assert died is not None and died.get("reason"), (
        "the actor's death is an event (fray.telemetry.events), with its reason"
    )
    # the call its process died in has ended too, failed (else a timeline or the live page shows it queued)
    ended = h.recorded_after(fray_ctx, cursor, "call.end", where=lambda data: data.get("status") == "error")
    assert ended is not None and ended.get("error") in ("ActorDiedError", "ActorUnavailableError"), ended


@requires_capability("process_isolation")
def test_crashed_actor_restarts_with_fresh_state(fray_ctx: JobContext) -> None:
    actor = fray_ctx.create_actor(h.Counter, args=(100,), options=ActorOptions(max_restarts=1))
    assert fray_ctx.get(actor.incr(), timeout=60) == 101
    with pytest.raises(ActorUnavailableError):  # restarting, not dead: it has a restart left
        fray_ctx.get(actor.crash(), timeout=60)
    assert fray_ctx.get(actor.incr(), timeout=120) == 101  # waits for the restart; __init__ ran again: fresh state
    with pytest.raises(ActorDiedError):  # no restart left now
        fray_ctx.get(actor.crash(), timeout=60)
    with pytest.raises(ActorDiedError):
        fray_ctx.get(actor.incr(), timeout=60)
