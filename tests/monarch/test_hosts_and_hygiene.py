"""Crash reporting time, leaving nothing behind, spec options. (Several hosts: test_multihost.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fray
from fray import TaskOptions, WorkerCrashedError
from fray.host import procfs
from fray_monarch.data.arena import shm_dir

PAUSE_S = 8.0  # longer than the 5 s Monarch was once told to wait for a process's answer


def pid_and_ppid() -> tuple[int, int]:
    return os.getpid(), os.getppid()


def _alive(pid: int) -> bool:
    return procfs.alive(pid)  # a zombie is dead for our purposes


def crash() -> None:
    os._exit(1)


def test_killed_worker_is_reported_without_waiting_for_the_timeout() -> None:
    ctx = fray.init("monarch?procs=2")
    try:
        assert ctx.get(ctx.create_task(pow, args=(2, 3)), timeout=60) == 8  # workers are up: time only the crash
        start = time.monotonic()
        with pytest.raises(WorkerCrashedError):
            ctx.get(ctx.create_task(crash, options=TaskOptions(max_retries=0)), timeout=60)
        # Reported when the process dies (well under a second here), not when get's timeout passes; the bound
        # is loose so a loaded 2-core CI machine cannot fail it.
        assert time.monotonic() - start < 20.0
        assert ctx.get(ctx.create_task(pow, args=(2, 5)), timeout=60) == 32
    finally:
        fray.shutdown()


class Pid:
    def pid(self) -> int:
        return os.getpid()


def test_a_worker_paused_for_seconds_is_not_reported_as_crashed() -> None:
    """A process that answers nothing for a while (a loaded machine, a debugger, SIGSTOP) is alive: its actor
    keeps its state and its calls complete once it runs again. Monarch's supervision gives a silent process
    HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE before calling it crashed."""
    ctx = fray.init("monarch?procs=1")
    pid = 0
    try:
        actor = ctx.create_actor(Pid)
        pid = ctx.get(actor.pid(), timeout=60)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(PAUSE_S)
        os.kill(pid, signal.SIGCONT)
        assert ctx.get(actor.pid(), timeout=60) == pid
        assert ctx.get(ctx.create_task(pow, args=(2, 3)), timeout=60) == 8
    finally:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGCONT)  # (a failed test must not leave a stopped process behind)
        fray.shutdown()


SCRIPT = textwrap.dedent(
    """
    import os, sys, fray
    ctx = fray.init("monarch?procs=2")
    pids = set(ctx.get([ctx.create_task(os.getpid) for _ in range(20)], timeout=120))
    class A:
        def pid(self):
            return os.getpid()
    a = ctx.create_actor(A)
    pids.add(ctx.get(a.pid(), timeout=60))
    print("PIDS", " ".join(map(str, sorted(pids))), flush=True)
    fray.shutdown()
    """
)


def _shm_names() -> set[str]:
    """Names in /dev/shm and in fray's per-user directory there (made now if missing: it lasts, as ~/.cache)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return set(os.listdir("/dev/shm")) | {f"fray-dir/{n}" for n in os.listdir(shm_dir())}


def test_shutdown_leaves_no_process_socket_or_shm(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    shm_before = _shm_names()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("PIDS"))
    pids = [int(p) for p in line.split()[1:]]
    assert pids
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "worker processes outlived shutdown"
    leftovers = [p for p in tmpdir.rglob("*") if p.is_socket()]
    assert not leftovers, leftovers
    shm_after = _shm_names()
    assert not (shm_after - shm_before), shm_after - shm_before


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("monarch?procs=0", "procs=.*>= 1"),
        ("monarch?cpus=-1", "cpus=.*>= 0"),
        ("monarch?object_store_memory=0", "object_store_memory=.*positive"),
        ("monarch?transport=udp", "transport=.*one of auto, tcp, tls, rdma"),
        ("monarch?procz=2", "unknown option 'procz'"),
    ],
)
def test_spec_options_are_checked(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fray.init(spec)


def test_a_host_worker_ends_on_sigterm_and_removes_its_tls_files(tmp_path: Path) -> None:
    """scancel, `fray cluster stop` or a service manager end a host worker with SIGTERM: it ends like at the end
    of its stdin (its processes first), and its TLS files go with it (the watchdog that would remove them is one
    of the processes it kills)."""
    from fray.host.net import free_port

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    address = f"tls://127.0.0.1:{free_port()}"
    worker = subprocess.Popen(
        [sys.executable, "-m", "fray_monarch.worker", "--address", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    try:
        assert worker.stdout is not None
        for line in worker.stdout:  # serving: its TLS files are written by then
            if "serving on" in line:
                break
        assert list(tmp_path.glob("fray-tls-*/cert.pem")), list(tmp_path.iterdir())
        worker.send_signal(15)
        assert worker.wait(timeout=30) == 0
        assert not list(tmp_path.glob("fray-tls-*")), list(tmp_path.iterdir())
    finally:
        worker.kill()
        worker.wait()


SPMD_DRIVER = textwrap.dedent(
    """
    import os, sys, fray

    class Rank:
        def pid(self):
            return os.getpid()

    ctx = fray.init("monarch?procs=1&cpus=2")
    group = ctx.create_actor_group(Rank, 2, distributed=True)
    print("PIDS", *ctx.get(group.pid(), timeout=120), flush=True)
    if sys.argv[1] == "kill":
        ctx.kill(group)
        fray.shutdown()
    else:
        sys.stdin.read()  # until the test kills this driver
    """
)


@pytest.mark.parametrize("end", ["kill", "sigkill"])
def test_an_spmd_group_leaves_no_temp_directory(end: str) -> None:
    """Monarch's processes make a socket directory ("$TMPDIR/.tmpXXXXXX") that only a clean exit removes: an SPMD
    group's processes make theirs in the context's private directory (which fray removes however the driver
    ends), not in the user's TMPDIR (issue 28: 2 directories a group in /tmp)."""
    import signal
    import tempfile

    tmpdir = Path(tempfile.mkdtemp(prefix="fsp", dir="/tmp"))  # short: Monarch's socket paths are made below it
    try:
        driver = subprocess.Popen(
            [sys.executable, "-c", SPMD_DRIVER, end],
            env={**os.environ, "TMPDIR": str(tmpdir)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line.startswith("PIDS"), (line, driver.stderr.read() if driver.poll() is not None else "")
        members = [int(p) for p in line.split()[1:]]
        made = sorted(p.name for p in tmpdir.glob(".tmp*"))  # while the group lives
        if end == "sigkill":
            driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=120)
        deadline = time.monotonic() + 60
        while (any(_alive(p) for p in members) or list(tmpdir.glob("fray-m*"))) and time.monotonic() < deadline:
            time.sleep(0.2)  # fray's watchdog ends the members and removes the private directory
        assert not [p for p in members if _alive(p)], "the group's processes outlived their driver"
        assert not made and not list(tmpdir.glob(".tmp*")), (made, sorted(p.name for p in tmpdir.iterdir()))
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        shutil.rmtree(tmpdir, ignore_errors=True)
