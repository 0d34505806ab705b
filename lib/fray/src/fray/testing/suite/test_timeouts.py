"""Timeouts: a timed-out get, wait or as_completed returns after its timeout, not a multiple of it.

Each case waits on work that cannot finish in time (it waits for a flag file written only afterwards), so the
only way out is the timeout; the bound is the timeout plus a margin that a loaded machine needs, well below
twice the timeout, which is what a hook that waits its whole timeout twice takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fray
from fray import GetTimeoutError
from fray.context import JobContext
from fray.testing import group_workloads as g
from fray.testing import workloads as h

TIMEOUT = 2.0
MARGIN = 1.2  # (< TIMEOUT: waiting the timeout twice lands outside the bound)


def _elapsed(call: Callable[[], Any], error: type[BaseException] | None) -> float:
    start = time.monotonic()
    if error is None:
        call()
    else:
        with pytest.raises(error):
            call()
    return time.monotonic() - start


@pytest.fixture
def flag(tmp_path: Path) -> Iterator[Path]:
    """A flag file the blocked work waits for; written at teardown so that work ends."""
    path = tmp_path / "flag"
    yield path
    path.write_text("go")


def _within(elapsed: float) -> None:
    assert TIMEOUT * 0.9 <= elapsed < TIMEOUT + MARGIN, f"took {elapsed:.2f} s for a timeout of {TIMEOUT} s"


def test_a_timed_out_get_of_a_task_takes_its_timeout(fray_ctx: JobContext, flag: Path) -> None:
    ref = fray_ctx.create_task(g.wait_then, args=(str(flag), 1))
    _within(_elapsed(lambda: fray_ctx.get(ref, timeout=TIMEOUT), GetTimeoutError))
    _within(_elapsed(lambda: fray_ctx.get([ref], timeout=TIMEOUT), GetTimeoutError))
    flag.write_text("go")
    assert fray_ctx.get(ref, timeout=60) == 1


def test_a_timed_out_get_of_an_actor_call_takes_its_timeout(fray_ctx: JobContext, flag: Path) -> None:
    actor = fray_ctx.create_actor(h.Counter)
    try:
        fray_ctx.get(actor.get(), timeout=60)  # (started: the timeout below is the call's alone)
        blocked = fray_ctx.create_task(g.wait_then, args=(str(flag), 5))
        ref = actor.incr(blocked)  # (waits for its argument, which waits for the flag)
        _within(_elapsed(lambda: fray_ctx.get(ref, timeout=TIMEOUT), GetTimeoutError))
        flag.write_text("go")
        assert fray_ctx.get(ref, timeout=60) == 5
    finally:
        fray_ctx.kill(actor)


def test_a_timed_out_wait_takes_its_timeout(fray_ctx: JobContext, flag: Path) -> None:
    refs = [fray_ctx.create_task(g.wait_then, args=(str(flag), i)) for i in range(2)]

    def wait() -> None:
        done, pending = fray_ctx.wait(refs, num_returns=1, timeout=TIMEOUT)
        assert done == [] and pending == refs

    _within(_elapsed(wait, None))


def test_a_timed_out_as_completed_takes_its_timeout(fray_ctx: JobContext, flag: Path) -> None:
    ref = fray_ctx.create_task(g.wait_then, args=(str(flag), 1))
    _within(_elapsed(lambda: list(fray.as_completed([ref], timeout=TIMEOUT)), GetTimeoutError))
