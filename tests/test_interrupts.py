"""Ctrl-C in a driver, on every backend: one line naming what was interrupted, exit status 130 (fray.host.interrupts).
Each case is a real driver process sent a real SIGINT."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from fray.errors import BackendNotAvailableError
from fray.registry import get_backend

SPECS = {"in_memory": "in_memory", "ray": "ray", "monarch": "monarch?procs=1&cpus=2"}

# The helper thread says READY only once the main thread is inside the backend's get (a `_get` frame on its
# stack): a SIGINT then interrupts the get, never the lines before it.
DRIVER = textwrap.dedent(
    """
    import sys, threading, time
    import fray

    def sleepy():
        time.sleep(600)

    class Sleepy:
        def sleep(self):
            time.sleep(600)

    BLOCKED_IN = {"wait": "_wait", "as_completed": "completed"}.get(sys.argv[2], "_get")

    def ready_when_blocked(main):
        while True:
            frame = sys._current_frames().get(main)
            while frame is not None and frame.f_code.co_name != BLOCKED_IN:
                frame = frame.f_back
            if frame is not None:
                print("READY", flush=True)
                return
            time.sleep(0.05)

    ctx = fray.init(sys.argv[1])
    if sys.argv[2] == "own-hook":
        sys.excepthook = lambda kind, exc, tb: print("the program's own hook:", kind.__name__, file=sys.stderr)
    ref = ctx.create_actor(Sleepy).sleep() if sys.argv[2] == "actor" else ctx.create_task(sleepy)
    threading.Thread(target=ready_when_blocked, args=(threading.main_thread().ident,), daemon=True).start()
    try:
        if sys.argv[2] == "wait":
            ctx.wait([ref, ctx.create_task(sleepy)], num_returns=2)
        elif sys.argv[2] == "as_completed":
            for done in fray.as_completed([ref]):
                pass
        else:
            ctx.get(ref)
    except KeyboardInterrupt:
        if sys.argv[2] == "caught":
            import traceback
            print("CAUGHT", len(traceback.extract_tb(sys.exc_info()[2])), flush=True)
            raise SystemExit(7)
        raise
    """
)


def _interrupted(backend: str, mode: str) -> subprocess.CompletedProcess[str]:
    try:
        get_backend(backend)
    except BackendNotAvailableError as exc:
        pytest.skip(str(exc))
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, SPECS[backend], mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stderr is not None
        line = driver.stdout.readline()
        assert line == "READY\n", (line, driver.poll(), driver.stderr.read() if driver.poll() is not None else "")
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
        return subprocess.CompletedProcess(driver.args, driver.returncode, out, err)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


@pytest.mark.parametrize("backend", ["in_memory", "ray", "monarch"])
def test_ctrl_c_in_a_get_is_one_line_and_exit_status_130(backend: str) -> None:
    done = _interrupted(backend, "plain")
    assert done.returncode == 130, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "fray: interrupted while waiting for ctx.get of 1 ref\n" in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize(
    ("call", "what"), [("wait", "ctx.wait on 2 refs"), ("as_completed", "fray.as_completed of 1 ref")]
)
def test_ctrl_c_in_wait_and_as_completed_names_them(call: str, what: str) -> None:
    done = _interrupted("in_memory", call)
    assert done.returncode == 130, (done.returncode, done.stderr[-3000:])
    assert done.stderr == f"fray: interrupted while waiting for {what}\n", done.stderr[-3000:]


@pytest.mark.parametrize("backend", ["in_memory", "ray", "monarch"])
def test_a_caught_interrupt_shows_the_callers_frames_and_one_of_frays(backend: str) -> None:
    done = _interrupted(backend, "caught")
    assert done.returncode == 7, (done.returncode, done.stderr[-3000:])
    assert "CAUGHT 2\n" in done.stdout, (done.stdout, done.stderr[-3000:])  # the driver's frame, then get's


def test_a_programs_own_excepthook_is_left_alone() -> None:
    done = _interrupted("in_memory", "own-hook")
    assert "the program's own hook: KeyboardInterrupt" in done.stderr, done.stderr[-3000:]
    assert "fray: interrupted" not in done.stderr, done.stderr[-3000:]


def test_ctrl_c_in_a_get_of_a_running_actor_call_ends_the_program_at_once() -> None:
    """in_memory ran actor calls on a ThreadPoolExecutor, whose threads Python joins at exit: the program waited
    for the 600 s call (issue 28: one SIGINT did not end it, a second printed a traceback)."""
    done = _interrupted("in_memory", "actor")
    assert done.returncode == 130, (done.returncode, done.stderr[-3000:])
    assert done.stderr == "fray: interrupted while waiting for ctx.get of 1 ref\n", done.stderr[-3000:]


ENDS_WHILE_AN_ACTOR_RUNS = textwrap.dedent(
    """
    import sys, time
    import fray

    class Sleepy:
        def sleep(self):
            time.sleep(600)

    ctx = fray.init("in_memory")
    ref = ctx.create_actor(Sleepy).sleep()
    time.sleep(0.5)
    if sys.argv[1] == "shutdown":
        fray.shutdown()
    print("END", flush=True)
    """
)


@pytest.mark.parametrize("how", ["falls off the end", "shutdown"])
def test_a_script_that_ends_while_an_actor_call_runs_does_not_wait_for_it(how: str) -> None:
    """The running call is abandoned with the process, as Ray's driver exit ends its workers (docs/concepts.md)."""
    done = subprocess.run(
        [sys.executable, "-c", ENDS_WHILE_AN_ACTOR_RUNS, how], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout == "END\n", (done.returncode, done.stderr[-3000:])
