"""A driver that ends without fray.shutdown() (or after it) exits with its own status, however loaded the machine.

Two Monarch actors live in a driver's own process: the context's coordinator, and the one Monarch makes in every
client (its shutdown leaves that one running). Each is served by a Python thread that waits in Monarch's native
code. Such a thread still alive when the interpreter finalizes dies inside that code as it wakes (Python ends a
thread that wants the interpreter back by unwinding it, which Monarch's native frames turn into an abort): the
program then ends with SIGABRT instead of its own status. So fray's exit hook stops both, which joins their
threads, while Python can still run them. Each case runs in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

DRIVER = textwrap.dedent(
    """
    import collections, json, sys, threading
    import fray
    from fray_monarch.driver import instances

    def actor_threads():
        # Monarch serves each sync actor from a "monarch-actor-driver" thread whose first argument is the actor
        named = [t for t in threading.enumerate() if t.name == "monarch-actor-driver"]
        actors = sorted(type(getattr(t._args[0], "instance", None)).__name__ for t in named)
        return actors + [t.name for t in threading.enumerate() if t.name == "fray-monarch-replies"]

    ctx = fray.init("monarch?procs=1")
    assert ctx.get(ctx.create_task(abs, (-3,)), timeout=120) == 3
    group = ctx.create_actor_group(collections.Counter, 1)
    assert ctx.get(group.total(), timeout=120) == [0]
    before = actor_threads()
    if sys.argv[2] == "shutdown":
        fray.shutdown()
    if sys.argv[2] != "atexit only":
        instances.run_exit_hook()  # what atexit runs first at the end of the program
        print("RESULT", json.dumps({"before": before, "after": actor_threads()}), flush=True)
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.mark.parametrize("end", ["no shutdown", "shutdown"])
def test_the_exit_hook_ends_the_thread_of_every_actor_in_the_driver(end: str) -> None:
    """Without shutdown(), and after it: Monarch's own actor outlives a context's shutdown."""
    out = subprocess.run([sys.executable, "-c", DRIVER, "0", end], capture_output=True, text=True, timeout=300)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out.stderr[-3000:]
    assert json.loads(line[len("RESULT ") :]) == {
        # fray's coordinator; Monarch's, in every client; the reader of group members' answers
        "before": ["Coordinator", "_ControllerController", "fray-monarch-replies"],
        "after": [],
    }
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_driver_ending_without_shutdown_exits_with_its_own_status() -> None:
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, "3", "atexit only"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 3, out.stderr[-3000:]
