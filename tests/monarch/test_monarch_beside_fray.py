"""Users adopt fray gradually, beside their own Monarch code: Monarch used directly in the same process works
before fray and after `fray.shutdown()` (issue 29: fray removed its private directory, where Monarch's runtime keeps
its socket directory, under the still-running runtime: "failed to configure process ... No such file or
directory")."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

DRIVER = textwrap.dedent(
    """
    import sys
    import fray
    from monarch.actor import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def echo(self, x: int) -> int:
            return x

    def raw_monarch():
        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            return procs.spawn("echo", Echo).echo.call_one(7).get(timeout=60)
        finally:
            procs.stop().get(timeout=60)

    def with_fray():
        ctx = fray.init("monarch?procs=1")
        try:
            return ctx.get(ctx.create_task(pow, args=(2, 5)), timeout=120)
        finally:
            fray.shutdown()

    first, second = (with_fray, raw_monarch) if sys.argv[1] == "fray-first" else (raw_monarch, with_fray)
    steps = [first, second, first]
    print("RESULT", [step() for step in steps], flush=True)
    """
)


@pytest.mark.parametrize("order", ["fray-first", "monarch-first"])
def test_monarch_used_directly_before_and_after_fray_in_one_process(order: str) -> None:
    done = subprocess.run([sys.executable, "-c", DRIVER, order], capture_output=True, text=True, timeout=300)
    expected = [32, 7, 32] if order == "fray-first" else [7, 32, 7]
    assert f"RESULT {expected}" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])
