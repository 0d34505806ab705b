"""After fray.shutdown() nothing fray started for a monarch context remains in the driver's process: no watchdog
child, no private temp directory, no TLS files (Monarch's own runtime lives on in the process: 0.7 cannot stop
it), and the next context in the same process works. Each case runs in a fresh Python process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

DRIVER = textwrap.dedent(
    """
    import glob, json, os, socket, sys, time
    import fray
    from fray.procfs import children_of

    def left():
        kids = [open(f"/proc/{p}/cmdline").read().replace("\\0", " ").strip() for p in children_of(os.getpid())]
        tag = f"{os.getpid()}-"
        dirs = [d for d in glob.glob("/tmp/fray-m*") if open(os.path.join(d, "owner")).read().startswith(tag)]
        mine = os.environ["FRAY_TLS_RUNTIME_DIR"].partition(":")[2]
        return {"children": kids, "private dirs": dirs, "tls files": os.path.exists(mine)}

    seen = []
    for _ in range(2):
        ctx = fray.init(sys.argv[1])
        host = ctx.get(ctx.create_task(socket.gethostname), timeout=120)
        fray.shutdown()
        deadline = time.monotonic() + 20
        while (now := left()) != {"children": [], "private dirs": [], "tls files": False}:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        seen.append([host, now])
    print("RESULT", json.dumps(seen))
    """
)


def _run(spec: str, env: dict[str, str]) -> list[list[object]]:
    out = subprocess.run([sys.executable, "-c", DRIVER, spec], capture_output=True, text=True, timeout=300, env=env)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out.stderr[-3000:]
    return list(json.loads(line[len("RESULT ") :]))


def test_a_local_context_leaves_nothing_after_shutdown() -> None:
    clean = {"children": [], "private dirs": [], "tls files": False}
    assert _run("monarch?procs=1", dict(os.environ)) == [[socket.gethostname(), clean]] * 2


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def tls_worker(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    env = {**os.environ, "FRAY_TLS_DIR": str(tmp_path / "tls")}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tls://127.0.0.1:{port}"
    worker = subprocess.Popen(
        [sys.executable, "-m", "fray_monarch.worker", "--address", address],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not _listening(port):
            assert worker.poll() is None and time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.2)
        yield address, env
    finally:
        worker.kill()
        worker.wait(10)


def test_an_attached_context_over_tls_leaves_nothing_and_attaches_again(tls_worker: tuple[str, dict[str, str]]) -> None:
    address, env = tls_worker
    clean = {"children": [], "private dirs": [], "tls files": False}
    assert _run(f"monarch?hosts={address}&procs=1", env) == [[socket.gethostname(), clean]] * 2
