"""What tasks and actors print reaches the driver's console, each line prefixed with who printed it, as Ray
users know it: `(square pid=4242) squaring 3`; `log_to_driver=false` turns it off. Run for every backend in a
driver subprocess (the console is its stdout/stderr)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from fray.errors import BackendNotAvailableError
from fray.registry import get_backend

DRIVER = textwrap.dedent(
    """
    import sys, time, fray

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
    time.sleep(1.5)  # output of other processes is forwarded asynchronously
    fray.shutdown()
    """
)

SPECS = {"in_memory": "in_memory", "ray": "ray", "monarch": "monarch?procs=2"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run(spec: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "FRAY_BACKEND")}
    out = subprocess.run([sys.executable, "-c", DRIVER, spec], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return _ANSI.sub("", out.stdout + out.stderr)


@pytest.mark.parametrize("backend", list(SPECS))
def test_worker_lines_reach_the_driver_prefixed(backend: str) -> None:
    try:
        get_backend(backend)
    except BackendNotAvailableError:
        pytest.skip(f"backend {backend!r} is not installed here (make test installs it)")
    text = _run(SPECS[backend])
    for line in ("squaring 0", "squaring 1", "complaining 1"):
        assert re.search(rf"^\(square pid=\d+[^)]*\) {line}$", text, re.M), text
    assert re.search(r"^\(Greeter pid=\d+[^)]*\) hello fray$", text, re.M), text
    assert re.search(r"^driver says bye$", text, re.M), text
    assert "Monarch internal logs are being written" not in text  # Monarch's banner (see fray_monarch._runtime)


@pytest.mark.parametrize("backend", list(SPECS))
def test_log_to_driver_false_keeps_worker_lines_off_the_console(backend: str) -> None:
    try:
        get_backend(backend)
    except BackendNotAvailableError:
        pytest.skip(f"backend {backend!r} is not installed here (make test installs it)")
    sep = "&" if "?" in SPECS[backend] else "?"
    text = _run(f"{SPECS[backend]}{sep}log_to_driver=false")
    if backend == "in_memory":
        # One process: the lines are printed, just not labelled. Unlabelled prints from two task threads are plain
        # Python prints, which may interleave ("squaring 0squaring 1\n\n": print writes text and newline apart).
        assert "squaring 0" in text and "squaring 1" in text and "(square pid=" not in text, text
    else:
        assert "squaring" not in text and "hello fray" not in text, text
    assert "driver says bye" in text
