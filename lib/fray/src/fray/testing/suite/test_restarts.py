"""A call made while an actor or an SPMD group restarts waits for the restart and then runs, bounded by its
caller's timeout (as Ray's calls to a restarting actor do); only the calls in flight at the death fail.

The actor's process is SIGKILLed by the test (`kill_descendant`: only a process proven to descend from the test's
own), and the call is made 50 ms later, when a backend may be learning of the death."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fray import ActorOptions, GetTimeoutError
from fray.context import JobContext
from fray.testing import group_workloads as g
from fray.testing import requires_capability
from fray.testing import workloads as h

AFTER_KILL = 0.05  # seconds from the SIGKILL to the call (the measurement of raw Ray)
SLOW_RESTART = 3.0  # seconds a slow restart's __init__ sleeps: three times the short timeout below
SHORT_TIMEOUT = 1.0


@requires_capability("process_isolation")
def test_a_call_made_just_after_an_actors_process_died_runs_after_the_restart(fray_ctx: JobContext) -> None:
    actor = fray_ctx.create_actor(h.Counter, args=(100,), options=ActorOptions(max_restarts=1))
    try:
        assert fray_ctx.get(actor.incr(), timeout=60) == 101
        pid = fray_ctx.get(actor.pid(), timeout=60)
        h.kill_descendant(pid)
        time.sleep(AFTER_KILL)
        start = time.monotonic()
        assert fray_ctx.get(actor.incr(), timeout=120) == 101  # __init__ ran again: fresh state, not an error
        print(f"the call made {AFTER_KILL} s after the kill returned {time.monotonic() - start:.2f} s later")
        assert fray_ctx.get(actor.pid(), timeout=60) != pid
    finally:
        fray_ctx.kill(actor)


@requires_capability("process_isolation")
def test_a_short_timeout_during_a_long_actor_restart_times_out(fray_ctx: JobContext, tmp_path: Path) -> None:
    marker = str(tmp_path / "started")
    options = ActorOptions(max_restarts=1)
    actor = fray_ctx.create_actor(h.RestartsSlowly, args=(marker, SLOW_RESTART, 100), options=options)
    try:
        pid = fray_ctx.get(actor.pid(), timeout=60)
        h.kill_descendant(pid)
        time.sleep(AFTER_KILL)
        ref = actor.incr()
        with pytest.raises(GetTimeoutError):  # the restart is still in its __init__: a timeout, not an error
            fray_ctx.get(ref, timeout=SHORT_TIMEOUT)
        assert fray_ctx.get(ref, timeout=120) == 101  # the same call ran once the restart was done
    finally:
        fray_ctx.kill(actor)


@requires_capability("spmd_groups", "spmd_gang_restart")
def test_a_group_call_made_just_after_a_rank_died_runs_after_the_group_restart(fray_ctx: JobContext) -> None:
    pytest.importorskip("torch", reason="torch is not installed (the group uses torch.distributed)")
    group = fray_ctx.create_actor_group(g.GlooMember, 2, distributed=True, options=ActorOptions(max_restarts=1))
    try:
        before = fray_ctx.get(group.facts(), timeout=180)
        h.kill_descendant(before[1]["pid"])
        time.sleep(AFTER_KILL)
        start = time.monotonic()
        assert fray_ctx.get(group.all_reduce(2.0), timeout=180) == [[4.0], [4.0]]
        print(f"the group call made {AFTER_KILL} s after the kill returned {time.monotonic() - start:.2f} s later")
        assert [f["restarts"] for f in fray_ctx.get(group.facts(), timeout=60)] == [1, 1]
    finally:
        fray_ctx.kill(group)


@requires_capability("spmd_groups", "spmd_gang_restart")
def test_a_short_timeout_during_a_long_group_restart_times_out(fray_ctx: JobContext) -> None:
    pytest.importorskip("torch", reason="torch is not installed (the group uses torch.distributed)")
    options = ActorOptions(max_restarts=1)
    group = fray_ctx.create_actor_group(
        g.GlooMemberRestartingSlowly, 2, args=(SLOW_RESTART,), distributed=True, options=options
    )
    try:
        before = fray_ctx.get(group.facts(), timeout=180)
        h.kill_descendant(before[0]["pid"])
        time.sleep(AFTER_KILL)
        refs = group.all_reduce(3.0)
        with pytest.raises(GetTimeoutError):  # the members are still in their __init__: a timeout, not an error
            fray_ctx.get(refs, timeout=SHORT_TIMEOUT)
        assert fray_ctx.get(refs, timeout=180) == [[6.0], [6.0]]  # the same call ran once the group was back
    finally:
        fray_ctx.kill(group)
