"""An actor's process that dies fails what was pending on it as soon as fray sees the death (a pidfd here), not
when Monarch's supervision poll finds it: the driver below polls every 30 s, so a call or stream left to Monarch
would wait that long. A reply the process sent just before it ended is still that call's answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

BOUND = 10.0  # seconds: well past fray's grace for a reply on its way, well short of the 30 s poll

DRIVER = textwrap.dedent(
    """
    import json, os, threading, time
    import fray
    from fray import ActorOptions

    class Dies:
        def pid(self):
            return os.getpid()

        def crash(self):
            os._exit(1)

        def answer_then_end(self):
            threading.Timer(0.3, os._exit, (1,)).start()  # (after its reply has gone)
            return 42

        def count(self):
            yield 1
            time.sleep(0.2)
            os._exit(1)

    # fray learns a process's pid from its worker's first answer, which may come after the actor's own on a loaded
    # machine: a process that ends before it is seen only by Monarch's poll (30 s here)
    SETTLE = 1.0

    def timed(call):
        start = time.monotonic()
        try:
            return repr(call()), time.monotonic() - start
        except Exception as exc:
            return type(exc).__name__, time.monotonic() - start

    ctx = fray.init("monarch?procs=1")
    out = {}
    dies = ctx.create_actor(Dies)
    ctx.get(dies.pid(), timeout=60)
    time.sleep(SETTLE)
    out["call"] = timed(lambda: ctx.get(dies.crash(), timeout=120))
    restarts = ctx.create_actor(Dies, options=ActorOptions(max_restarts=1))
    ctx.get(restarts.pid(), timeout=60)
    time.sleep(SETTLE)
    out["restarting"] = timed(lambda: ctx.get(restarts.crash(), timeout=120))
    out["restarted"] = timed(lambda: ctx.get(restarts.pid(), timeout=120) > 0)
    streams = ctx.create_actor(Dies)
    ctx.get(streams.pid(), timeout=60)
    time.sleep(SETTLE)
    out["stream"] = timed(lambda: [ctx.get(ref, timeout=120) for ref in streams.count.stream()])
    answers = ctx.create_actor(Dies)
    ctx.get(answers.pid(), timeout=60)
    ref = answers.answer_then_end()
    time.sleep(1.0)  # (its process has ended by now)
    out["answered"] = timed(lambda: ctx.get(ref, timeout=120))
    print("RESULT", json.dumps(out), flush=True)
    fray.shutdown()
    """
)


def test_what_was_pending_on_a_dead_actor_fails_when_fray_sees_the_death() -> None:
    env = {**os.environ, "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY": "30s", "FRAY_BACKEND": "monarch"}
    done = subprocess.run([sys.executable, "-c", DRIVER], env=env, capture_output=True, text=True, timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("RESULT "))
    assert out["call"][0] == "ActorDiedError" and out["call"][1] < BOUND, out
    assert out["restarting"][0] == "ActorUnavailableError" and out["restarting"][1] < BOUND, out
    assert out["restarted"][0] == "True", out
    assert out["stream"][0] == "ActorDiedError" and out["stream"][1] < BOUND, out
    assert out["answered"][0] == "42", out
