"""After fray.shutdown() nothing fray started for a monarch context remains in the driver's process (Monarch's own
runtime lives on in the process: 0.7 cannot stop it), and the next context in the same process works. The
process's private temp directory and TLS files stay, private, for the life of the process (a name freed while it
lives could be made again by another user: issue 29), and so does fray's watchdog, which removes them however the
process ends; all three are gone once it has ended. Each case runs in a fresh Python process."""

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
    from fray.host import procfs
    from fray.host.procfs import children_of

    def private(path):
        st = os.lstat(path)
        return os.path.isdir(path) and not os.path.islink(path) and st.st_uid == os.getuid() and not st.st_mode & 0o077

    def left():
        kids = [" ".join(procfs.cmdline(p) or []).strip() for p in children_of(os.getpid())]
        kids = ["the watchdog" if k.endswith(f"-m fray.host.watchdog {os.getpid()}") else k for k in kids]
        tag = f"{os.getpid()}-"
        owned = [os.path.join(d, "owner") for d in glob.glob("/tmp/fray-m*")]  # (a cluster's job roots have none)
        dirs = [os.path.dirname(o) for o in owned if os.path.isfile(o) and open(o).read().startswith(tag)]
        mine = os.environ["FRAY_TLS_RUNTIME_DIR"].partition(":")[2]
        tls = "private" if os.path.exists(mine) and private(mine) else "none" if not os.path.exists(mine) else "open"
        return {"children": kids, "private dirs": [private(d) for d in dirs], "tls files": tls}, dirs + [mine]

    seen, paths = [], []
    for _ in range(2):
        ctx = fray.init(sys.argv[1])
        host = ctx.get(ctx.create_task(socket.gethostname), timeout=120)
        fray.shutdown()
        deadline = time.monotonic() + 20
        while (now := left())[0]["children"] != ["the watchdog"]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        seen.append([host, now[0]])
        paths += now[1]
    print("RESULT", json.dumps(seen))
    print("PATHS", json.dumps(sorted(set(paths))))
    """
)


def _run(spec: str, env: dict[str, str]) -> list[list[object]]:
    """What was left after each of two contexts' shutdown; and checks that the process's private directories
    were gone soon after it ended."""
    out = subprocess.run([sys.executable, "-c", DRIVER, spec], capture_output=True, text=True, timeout=300, env=env)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out.stderr[-3000:]
    paths = json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("PATHS "))[len("PATHS ") :])
    deadline = time.monotonic() + 20
    while [p for p in paths if os.path.exists(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in paths if os.path.exists(p)], "the watchdog removes them when the process ends"
    return list(json.loads(line[len("RESULT ") :]))


def test_a_local_context_leaves_nothing_after_shutdown() -> None:
    clean = {"children": ["the watchdog"], "private dirs": [True], "tls files": "none"}  # (no TLS on one machine)
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
    clean = {"children": ["the watchdog"], "private dirs": [True], "tls files": "private"}
    assert _run(f"monarch?hosts={address}&procs=1", env) == [[socket.gethostname(), clean]] * 2
