"""Every thread a context starts is stopped and joined by its owner at shutdown: after a context ran what
fray.testing.threads.exercise runs (a task, an actor call, a get that timed out, as_completed, a progress bar, a
dashboard page, an SPMD group left alive, an executor) and shut down, no thread fray named (`fray-...`) that it
started is left alive, but those that are process-wide on purpose (fray.testing.threads.PROCESS_WIDE, each with
its reason)."""

from __future__ import annotations

import threading

import pytest

from fray.context import JobContext
from fray.testing.threads import exercise, fray_threads, leftover_threads


@pytest.fixture
def threads_before() -> set[threading.Thread]:
    return fray_threads()


# (threads_before first: fixtures of one scope are made in the order the case names them, so the context's own
# threads are not among those taken before it.)
def test_a_shut_down_context_leaves_no_thread_of_its_own(
    threads_before: set[threading.Thread], fray_own_ctx: JobContext
) -> None:
    try:
        exercise(fray_own_ctx)
    finally:
        fray_own_ctx.shutdown()
    assert leftover_threads(threads_before) == []
