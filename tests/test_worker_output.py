"""What tasks and actors print reaches the driver's console, each line prefixed with who printed it, as Ray
users know it: `(square pid=4242) squaring 3`; `log_to_driver=false` turns it off. Run for every backend in a
driver subprocess (the console is its stdout/stderr)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import IO

import pytest

from fray.errors import BackendNotAvailableError
from fray.registry import get_backend

DRIVER = textwrap.dedent(
    """
    import sys, fray

    def square(x):
        print(f"squaring {x}", flush=True)
        print(f"complaining {x}", file=sys.stderr, flush=True)
        return x * x

    class Greeter:
        def hello(self, who):
            print(f"hello {who}", flush=True)
            return who

    ctx = fray.init(sys.argv[1])
    assert ctx.get([ctx.create_task(square, args=(i,)) for i in range(2)], timeout=120) == [0, 1]
    greeter = ctx.create_actor(Greeter)
    assert ctx.get(greeter.hello("fray"), timeout=120) == "fray"
    print("driver says bye", flush=True)
    sys.stdin.readline()  # the test releases the driver once the forwarded lines arrived (it is asynchronous)
    fray.shutdown()
    """
)

SPECS = {"in_memory": "in_memory", "ray": "ray", "monarch": "monarch?procs=2"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _collect(stream: IO[str], lines: list[str]) -> None:
    for line in iter(stream.readline, ""):
        lines.append(line)


def _run(spec: str, until: Callable[[str], bool], settle: float = 0.0) -> str:
    """The driver's console (stdout then stderr) once `until` holds for it, or after 120 s.

    Worker output is forwarded asynchronously (Ray: through its log monitor), so the driver waits on its stdin
    until the lines it should forward have arrived, rather than sleeping a fixed time. `settle` keeps it alive a
    little longer after `until` holds, for tests of lines that must not arrive.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "FRAY_BACKEND")}
    # Ray's driver holds back a line that matches another worker's up to numbers ("squaring 1" after "squaring 0")
    # to print it later as "[repeated Nx]", at the latest at shutdown; each line should arrive on its own here.
    env["RAY_DEDUP_LOGS"] = "0"
    cmd = [sys.executable, "-u", "-c", DRIVER, spec]  # -u: Ray prints forwarded lines without a flush
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdin and proc.stdout and proc.stderr
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=_collect, args=pair, daemon=True) for pair in ((proc.stdout, out), (proc.stderr, err))
    ]
    for reader in readers:
        reader.start()

    def console() -> str:
        return _ANSI.sub("", "".join(list(out)) + "".join(list(err)))

    try:
        deadline = time.monotonic() + 120
        while not until(console()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(settle)
        with contextlib.suppress(BrokenPipeError):  # the driver already ended: its return code tells why
            proc.stdin.write("\n")
            proc.stdin.close()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    text = console()
    assert proc.returncode == 0, text
    return text


@pytest.mark.parametrize("backend", list(SPECS))
def test_worker_lines_reach_the_driver_prefixed(backend: str) -> None:
    try:
        get_backend(backend)
    except BackendNotAvailableError:
        pytest.skip(f"backend {backend!r} is not installed here (make test installs it)")
    expected = [rf"^\(square pid=\d+[^)]*\) {line}$" for line in ("squaring 0", "squaring 1", "complaining 1")]
    expected += [r"^\(Greeter pid=\d+[^)]*\) hello fray$", r"^driver says bye$"]
    text = _run(SPECS[backend], until=lambda text: all(re.search(p, text, re.M) for p in expected))
    for pattern in expected:
        assert re.search(pattern, text, re.M), text
    assert "Monarch internal logs are being written" not in text  # Monarch's banner (see fray_monarch.core.runtime)


@pytest.mark.parametrize("backend", list(SPECS))
def test_log_to_driver_false_keeps_worker_lines_off_the_console(backend: str) -> None:
    try:
        get_backend(backend)
    except BackendNotAvailableError:
        pytest.skip(f"backend {backend!r} is not installed here (make test installs it)")
    sep = "&" if "?" in SPECS[backend] else "?"
    # Absence needs a wait: the driver stays up 3 s after its last line, about twice Ray's forwarding delay here
    # (in_memory's workers are threads of the driver, whose prints are done before its results are read).
    wait = 0.0 if backend == "in_memory" else 3.0
    text = _run(f"{SPECS[backend]}{sep}log_to_driver=false", until=lambda text: "driver says bye" in text, settle=wait)
    if backend == "in_memory":
        # One process: the lines are printed, just not labelled. Unlabelled prints from two task threads are plain
        # Python prints, which may interleave ("squaring 0squaring 1\n\n": print writes text and newline apart).
        assert "squaring 0" in text and "squaring 1" in text and "(square pid=" not in text, text
    else:
        assert "squaring" not in text and "hello fray" not in text, text
    assert "driver says bye" in text
