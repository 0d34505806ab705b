"""Waiting on concurrent.futures.Future objects: "k of n done", in O(n), without polling.

concurrent.futures.wait offers only FIRST_COMPLETED and ALL_COMPLETED; `wait(refs, num_returns=k)` needs "k of
n". This installs one counting waiter (the same mechanism cf.wait uses) on the pending futures and removes it
afterwards, so repeated waits do not pile callbacks onto long-lived futures.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures._base import (  # type: ignore[attr-defined]
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    _AcquireFutures,
    _AllCompletedWaiter,
)
from typing import Any

__all__ = ["wait_for_count"]

_DONE_STATES = (FINISHED, CANCELLED_AND_NOTIFIED)


def wait_for_count(futures: Sequence[Future[Any]], count: int, timeout: float | None) -> set[int]:
    """Block until at least `count` futures are done or `timeout` passes; return the indices of done ones."""
    unique = list({id(f): f for f in futures}.values())
    with _AcquireFutures(unique):
        done = {i for i, f in enumerate(futures) if f._state in _DONE_STATES}
        if len(done) >= count or timeout == 0:
            return done
        pending = [f for f in unique if f._state not in _DONE_STATES]
        waiter = _AllCompletedWaiter(min(count - len(done), len(pending)), stop_on_exception=False)
        for f in pending:
            f._waiters.append(waiter)
    try:
        waiter.event.wait(timeout)
    finally:
        for f in pending:
            with f._condition:
                f._waiters.remove(waiter)
    return {i for i, f in enumerate(futures) if f.done()}
