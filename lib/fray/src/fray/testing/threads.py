"""Threads fray leaves behind: the helpers of the conformance case and unit cases that check every thread a
context starts is stopped and joined by its owner at shutdown (.agents/threads.md lists each thread and its owner).

Every thread fray starts is named `fray-...`, so one still alive after its owner shut down can be seen and
attributed. A few are process-wide on purpose, one per process and shared by every context; they are allowed
by name here, each with the reason.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request

from fray.context import JobContext
from fray.runtime.capabilities import Capability
from fray.runtime.completion import as_completed
from fray.runtime.current import using
from fray.testing import group_workloads as g
from fray.testing import workloads as h
from fray.types import ActorOptions

__all__ = ["PROCESS_WIDE", "exercise", "fray_threads", "leftover_threads"]

# Threads that outlive a context on purpose: one per process, shared by all of its contexts.
PROCESS_WIDE: dict[str, str] = {
    "fray-monarch-loop": "fray_monarch.core.runtime's one asyncio loop of the process, which turns Monarch futures "
    "into callbacks for every monarch context and worker runtime there; started on first need",
    "fray-monarch-pidwatch": "fray_monarch.core.runtime's one pidfd watcher of the process, which every monarch "
    "context and worker of the process asks to be told of a process's exit; started on first need",
    "fray-unmap": "fray_monarch.data.mappings' one sweeper of the process's shared-memory map table, which every "
    "monarch context and worker of the process maps values into; started at the first mapping",
    "fray-device-shares": "fray.runtime.device_shares' one share server of the process (its acceptor), which serves "
    "the device values of every context of the process; stopped and joined at exit",
    "fray-device-share": "a connection of that share server's, served while a reader holds it; joined with the "
    "server at exit",
}

TIMEOUT = 120.0


def fray_threads() -> set[threading.Thread]:
    """The live threads fray named (`fray-...`)."""
    return {t for t in threading.enumerate() if t.name.startswith("fray-") and t.is_alive()}


def leftover_threads(before: set[threading.Thread], within: float = 5.0) -> list[str]:
    """The names of fray threads alive now that were not in `before` and are not process-wide, after waiting up
    to `within` seconds for them to end (an owner's join is bounded; a thread may take a moment to notice)."""
    deadline = time.monotonic() + within
    while True:
        left = sorted(t.name for t in fray_threads() - before if t.name not in PROCESS_WIDE)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def exercise(ctx: JobContext) -> None:
    """What a pipeline does with a context: a task, an actor call, a get that times out, as_completed, a
    progress bar and an executor's map, each of which may start a thread of its own."""
    with using(ctx):
        _exercise(ctx)


def _exercise(ctx: JobContext) -> None:
    assert ctx.get(ctx.create_task(h.add, args=(1, 2)), timeout=TIMEOUT) == 3
    counter = ctx.create_actor(h.Counter)
    assert ctx.get(counter.incr(), timeout=TIMEOUT) == 1
    slow = ctx.create_task(h.sleep_then, args=(1.0, 1))  # (a thread running user code ends when it returns)
    try:
        ctx.get(slow, timeout=0.2)
    except TimeoutError:
        pass
    if Capability.CANCEL_RUNNING in ctx.capabilities:
        ctx.cancel(slow)
    refs = [ctx.create_task(h.add, args=(i, 1)) for i in range(4)]
    assert sorted(ctx.get(ref, timeout=TIMEOUT) for ref in as_completed(refs, timeout=TIMEOUT)) == [1, 2, 3, 4]
    assert ctx.get(refs, timeout=TIMEOUT, progress="always") == [1, 2, 3, 4]
    with contextlib.suppress(OSError):  # a page of the dashboard: its server and a request's thread
        urllib.request.urlopen(ctx.dashboard(), timeout=TIMEOUT).close()
    group = ctx.create_actor_group(g.Member, 2, options=ActorOptions(max_restarts=1))  # left for shutdown to end
    assert [i["rank"] for i in ctx.get(group.whoami(), timeout=TIMEOUT)] == [0, 1]
    with ctx.executor() as executor:
        assert list(executor.map(h.add, range(3), range(3), timeout=TIMEOUT)) == [0, 2, 4]
