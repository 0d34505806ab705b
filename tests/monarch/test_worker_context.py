"""The job context inside tasks and actors (a worker's, whose calls go through the driver's coordinator) keeps
the driver context's semantics."""

from __future__ import annotations

import time

import fray

SLOW = 60.0  # seconds the slow task sleeps: far above what the test allows the get


def slow() -> int:
    time.sleep(SLOW)
    return 1


def failing() -> None:
    raise ValueError("boom")


def get_slow_and_failing() -> tuple[str, float]:
    """get([slow, failing]) inside a task: what it raised, and after how long."""
    ctx = fray.get_job_context()
    slow_ref = ctx.create_task(slow)
    failing_ref = ctx.create_task(failing)
    start = time.monotonic()
    try:
        ctx.get([slow_ref, failing_ref], timeout=2 * SLOW)
        raised = "nothing"
    except Exception as exc:
        raised = f"{type(exc).__name__}: {exc}"
    elapsed = time.monotonic() - start
    ctx.cancel(slow_ref)
    return raised, elapsed


def test_get_of_a_list_in_a_task_raises_the_first_failure_without_waiting_for_the_rest() -> None:
    ctx = fray.init("monarch?procs=2&cpus=4")
    try:
        raised, elapsed = ctx.get(ctx.create_task(get_slow_and_failing), timeout=2 * SLOW)
        assert raised == "ValueError: boom"
        assert elapsed < SLOW / 2  # at once (well under a second here), not when the slow task ends
    finally:
        fray.shutdown()
