"""Whatever fray starts dies with its owner, however the owner ends: a driver in a subprocess is ended by a
normal exit without shutdown(), an exception, SIGINT, SIGTERM and SIGKILL; then nothing of its is left."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fray
from fray.host import procfs

WAYS = ["exit", "exception", "SIGINT", "SIGTERM", "SIGKILL"]

DRIVER = textwrap.dedent(
    """
    import os, sys, time, fray
    how, backend = sys.argv[1], sys.argv[2]
    cluster = fray.cluster(backend)
    marker, started = sys.argv[3], sys.argv[4]
    job = cluster.create_job(f"sleep {marker} & sleep {marker} & touch {started}; wait")
    deadline = time.time() + 60
    while not os.path.exists(started):  # both sleeps run: the owner may end now
        assert time.time() < deadline, cluster.get_job(job)
        time.sleep(0.05)
    print("READY", os.getpid(), flush=True)
    if how == "exit":
        sys.exit(0)
    if how == "exception":
        raise RuntimeError("the driver fails")
    time.sleep(600)
    """
)


def _descendants_sleeping(marker: str) -> list[int]:
    """pids of `sleep MARKER` processes (the job's: the marker is unique to one test) still alive anywhere."""
    found = []
    for pid in procfs.pids():
        argv = procfs.cmdline(pid)
        if argv is not None and argv[:2] == ["sleep", marker] and procfs.alive(pid):
            found.append(pid)
    return found


def _fray_job_dirs() -> set[str]:
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    return {p.name for p in tmp.glob("fray-jobs-*")} | {p.name for p in tmp.glob("fray-monarch-jobs-*")}


@pytest.mark.parametrize("how", WAYS)
def test_jobs_die_with_their_in_memory_owner(how: str, tmp_path: Path) -> None:
    _check_owner_death(how, "in_memory", tmp_path)


@pytest.mark.skipif("monarch" not in fray.available_backends(), reason="fray-monarch is not installed")
@pytest.mark.parametrize("how", WAYS)
def test_everything_of_a_monarch_owner_dies_with_it(how: str, tmp_path: Path) -> None:
    """A JobContext that has run a task and an actor (worker processes, store files in the driver and a
    worker) and a ClusterContext with a running job, in one driver: however it ends, within 10 s no process of
    its tree, no entry in the TMPDIR it was given and no /dev/shm file of its is left."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    marker = f"{300 + random.random():.6f}"  # only this test's job sleeps this long
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", MONARCH_DRIVER, how, marker, str(tmp_path / "started")],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
        tree: dict[int, str] = {}
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("READY"):
                err.seek(0)
                pytest.fail(f"the driver did not start: {line!r} {err.read()[-3000:]}")
            _, _, key = line.split()
            deadline = time.monotonic() + 30
            while len(_descendants_sleeping(marker)) < 2:  # the job's shell has started both sleeps
                assert time.monotonic() < deadline, "the job should be running"
                time.sleep(0.05)
            tree = _tree(proc.pid)
            assert len(tree) >= 5, tree  # driver, worker, job runner, the job's shell and its two sleeps
            assert _shm_of(key, tree), "the driver and its worker should have store files"
            if how in ("SIGINT", "SIGTERM", "SIGKILL"):
                proc.send_signal(getattr(signal, how))
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    deadline = time.monotonic() + 10
    while True:
        left = {pid: cmd for pid, cmd in _alive(tree).items() if pid != proc.pid}
        entries = _entries(tmp)
        shm = _shm_of(key, tree)
        if not left and not entries and not shm:
            return
        if time.monotonic() > deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            pytest.fail(f"left behind 10 s after {how}: processes {left}, temp entries {entries}, shm {shm}")
        time.sleep(0.2)


MONARCH_DRIVER = textwrap.dedent(
    """
    import os, sys, time, fray
    how, marker, started = sys.argv[1], sys.argv[2], sys.argv[3]
    MB = 2 ** 20

    def big(n):
        return b"x" * n  # above the inline limit: stored in the worker's store

    class Holder:
        def keep(self, value):
            self.value = value
            return len(value)

    ctx = fray.init("monarch?procs=1")
    made = ctx.create_task(big, args=(2 * MB,))
    put = ctx.put(b"y" * (2 * MB))  # stored in the driver's store
    holder = ctx.create_actor(Holder)
    assert ctx.get([holder.keep(made), holder.keep(put)], timeout=120) == [2 * MB, 2 * MB]
    cluster = fray.cluster("monarch")
    job = cluster.create_job(f"sleep {marker} & sleep {marker} & touch {started}; wait")
    deadline = time.time() + 60
    while not os.path.exists(started):  # both sleeps run: the owner may end now
        assert time.time() < deadline, cluster.get_job(job)
        time.sleep(0.05)
    print("READY", os.getpid(), ctx.ctl.key, flush=True)
    if how == "exit":
        sys.exit(0)
    if how == "exception":
        raise RuntimeError("the driver fails")
    time.sleep(600)
    """
)


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, start time, state) of a process, None if it is gone."""
    found = procfs.stat(pid)
    return None if found is None else (found.ppid, str(found.start), found.state)


def _tree(root: int) -> dict[int, str]:
    """pid -> start time of `root` and every process descended from it (a pid and its start time name one
    process: a reused pid is never mistaken for it)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for pid in procfs.pids():
        found = _stat(pid)
        if found is not None:
            parents.setdefault(found[0], []).append(pid)
            starts[pid] = found[1]
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in starts:
            tree[pid] = starts[pid]
            todo.extend(parents.get(pid, []))
    return tree


def _alive(tree: dict[int, str]) -> dict[int, str]:
    """The processes of `tree` still running (zombies count as gone), with their command lines."""
    alive = {}
    for pid, start in tree.items():
        found = _stat(pid)
        argv = procfs.cmdline(pid) if found is not None and found[1] == start and found[2] != "Z" else None
        if argv is not None:
            alive[pid] = " ".join(argv)[:200]
    return alive


def _entries(folder: Path) -> list[str]:
    """Everything below `folder` (os.walk skips what vanishes while it looks: removal may be under way)."""
    found = []
    for root, dirs, files in os.walk(folder):
        found += [os.path.relpath(os.path.join(root, name), folder) for name in dirs + files]
    return sorted(found)


def _shm_of(key: str, tree: dict[int, str]) -> list[str]:
    """/dev/shm files of the driver's context `key` (its store files and their lock file) or of a process of
    its tree (store files are named fray.<context>.<host>.<pid>-<start time>-<pid namespace>.<random>, in
    /dev/shm/fray-<uid>)."""
    directory = f"/dev/shm/fray-{os.getuid()}"
    if not os.path.isdir(directory):
        return []
    tags = {f"{pid}-{start}" for pid, start in tree.items()}
    return sorted(
        n
        for n in os.listdir(directory)
        if n.startswith(f"fray.{key}.")
        or (n.startswith("fray.") and len(n.split(".")) == 5 and "-".join(n.split(".")[3].split("-")[:2]) in tags)
    )


def _check_owner_death(how: str, backend: str, tmp_path: Path) -> None:
    before_dirs = _fray_job_dirs()
    marker = f"{300 + random.random():.6f}"  # only this test's job sleeps this long
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, how, backend, marker, str(tmp_path / "started")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.stderr else "")
        deadline = time.monotonic() + 30
        while len(_descendants_sleeping(marker)) < 2:  # the job's shell has started both sleeps
            assert time.monotonic() < deadline, "the job should be running"
            time.sleep(0.05)
        if how in ("SIGINT", "SIGTERM", "SIGKILL"):
            proc.send_signal(getattr(signal, how))
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    deadline = time.monotonic() + 10
    while _descendants_sleeping(marker) or (_fray_job_dirs() - before_dirs):
        if time.monotonic() > deadline:
            left = _descendants_sleeping(marker)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"left behind after {how}: processes {left}, dirs {_fray_job_dirs() - before_dirs}")
        time.sleep(0.2)


IN_MEMORY_CHILDREN = textwrap.dedent(
    """
    import os, sys, time, fray
    from fray import RuntimeEnv, TaskOptions

    class Member:
        def __init__(self):
            import torch.distributed as dist
            dist.init_process_group("gloo")

        def pid(self):
            return os.getpid()

    def sleep_in_child(seconds):
        print(os.getpid(), flush=True)
        time.sleep(seconds)

    ctx = fray.init("in_memory?cpus=2")
    group = ctx.create_actor_group(Member, 2, distributed=True)
    members = ctx.get(group.pid(), timeout=120)
    options = TaskOptions(runtime_env=RuntimeEnv(env={"FRAY_TEST_CHILD": "1"}))
    ctx.create_task(sleep_in_child, args=(600,), options=options)  # a task in a child process of its own
    print("READY", *members, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_in_memory_child_processes_die_with_their_owner(how: str) -> None:
    """SPMD members and a running runtime_env task each run in a child process; the owner ends by a signal (no
    Python cleanup with SIGKILL): within 10 s none of them is left."""
    pytest.importorskip("torch", reason="SPMD groups need torch.distributed")
    proc = subprocess.Popen(
        [sys.executable, "-c", IN_MEMORY_CHILDREN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    children: dict[int, str] = {}  # pid -> start time (_tree): only these very processes are looked at, or killed
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]  # the task's pid and READY, in either order
        ready = next((line for line in lines if line.startswith("READY")), "")
        assert ready, f"the driver did not start: {lines} {proc.stderr.read() if proc.stderr else ''}"
        task_pid = next(line for line in lines if not line.startswith("READY"))
        tree = _tree(proc.pid)
        children = {pid: tree[pid] for pid in [int(p) for p in ready.split()[1:]] + [int(task_pid)] if pid in tree}
        assert len(_alive(children)) == 3, (lines, tree)  # two members and the task, all descended from the owner
        proc.send_signal(getattr(signal, how))
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    deadline = time.monotonic() + 10
    while left := _alive(children):
        if time.monotonic() > deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"child processes left 10 s after the owner's {how}: {left}")
        time.sleep(0.1)
