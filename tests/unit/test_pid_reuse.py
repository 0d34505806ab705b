"""A recorded pid may, after its process ended or after a reboot, belong to anyone: fray signals a recorded
process or group only while it is proven the recorded one (fray.host.procfs.Identity: pid, start time, boot). Each
case records a process that has ended and gives its number to an unrelated `sleep` in a session of its own, as
pid reuse would; the real `fray` command (and the watchdog) must leave that sleep alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fray.host import procfs
from fray.host.state_dir import read_json, write_json

FRAY = str(Path(sys.executable).parent / "fray")


@pytest.fixture
def stranger() -> Iterator[procfs.Identity]:
    """An unrelated process leading a process group of its own."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        identity = procfs.Identity.of(proc.pid)
        assert identity is not None
        yield identity
        assert proc.poll() is None, "fray signalled a process that was not its own"
    finally:
        proc.kill()
        proc.wait()


def _reused(stranger: procfs.Identity, recorded: dict[str, int | str]) -> dict[str, int | str]:
    """The stranger's pid, with what was recorded of the process that had that number before (start, boot)."""
    return {**recorded, "pid": stranger.pid}


def _fray(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FRAY, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "FRAY_BACKEND"}, "FRAY_STATE_DIR": str(tmp_path)}


@pytest.mark.parametrize("runner_died", [False, True], ids=["ended", "runner-died"])
def test_stop_and_delete_of_a_job_never_signal_a_reused_pid(
    env: dict[str, str], tmp_path: Path, stranger: procfs.Identity, runner_died: bool
) -> None:
    submitted = _fray(env, "job", "submit", "--backend", "in_memory", "--no-wait", "--", "true")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().splitlines()[-1]
    state_file = tmp_path / "jobs" / job / "state.json"
    deadline = time.monotonic() + 60
    while (read_json(state_file) or {}).get("status") != "SUCCEEDED":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    state = read_json(state_file) or {}
    state.update(pid=stranger.pid, pgid=stranger.pid, leader=_reused(stranger, state["leader"]))
    if runner_died:  # it never recorded the end: the job counts as possibly running
        state.update(status="RUNNING", runner=_reused(stranger, state["runner"]))
    write_json(state_file, state)
    assert _fray(env, "job", "stop", job).returncode == 0
    assert _fray(env, "job", "delete", job).returncode == 0


@pytest.mark.parametrize("backend", ["ray", "monarch"])
def test_cluster_stop_never_signals_a_reused_pid(
    env: dict[str, str], tmp_path: Path, stranger: procfs.Identity, backend: str
) -> None:
    pytest.importorskip(f"fray_{backend}")
    record = {"backend": backend, "address": "http://127.0.0.1:1", "pid": stranger.pid, "pgid": stranger.pid}
    record["leader"] = {"pid": stranger.pid, "start": stranger.start - 1, "boot": stranger.boot}  # not its start
    write_json(tmp_path / "clusters" / f"{backend}.json", record)
    stopped = _fray(env, "cluster", "stop", "--backend", backend)
    assert stopped.returncode == 0 and "was not running" in stopped.stderr, stopped.stderr
    assert not (tmp_path / "clusters" / f"{backend}.json").exists()


def test_the_watchdog_signals_only_groups_proven_its_own(stranger: procfs.Identity) -> None:
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ours = procfs.Identity.of(other.pid)
        assert ours is not None
        lines = [
            "group " + json.dumps({"pid": stranger.pid, "start": stranger.start + 1, "boot": stranger.boot}),
            "group " + json.dumps(ours.record()),
        ]
        done = subprocess.run(
            [sys.executable, "-m", "fray.host.watchdog", str(os.getpid())],
            input="\n".join(lines) + "\n",
            text=True,
            timeout=60,
        )
        assert done.returncode == 0
        assert other.wait(30) != 0  # the proven group was ended; the stranger (checked by its fixture) was not
    finally:
        other.kill()
        other.wait()


def test_a_group_whose_leader_ended_is_still_ended_in_the_same_boot(tmp_path: Path) -> None:
    """The leader exits; its group lives on (a child): the group is still the recorded one's, and is stopped."""
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        child = subprocess.Popen(["sleep", "300"])
        open({str(tmp_path / "child")!r}, "w").write(str(child.pid))
        """
    )
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    identity = procfs.Identity.of(leader.pid, zombie_ok=True)
    assert identity is not None
    leader.wait(60)
    child = int((tmp_path / "child").read_text())
    assert procfs.alive(child) and identity.group_is_ours()
    assert procfs.stop_group(identity, grace=5.0)
    assert not procfs.alive(child)


def test_local_jobs_stop_never_signals_a_reused_pid(tmp_path: Path) -> None:
    """LocalJobs.stop signalled the job's pid as a group unproven, last of all (issue 29, item 7): a stop that came
    while the job was ending could reach whatever group had that number next. Here the job has ended and its
    number is given to an unrelated group, as reuse would, while the stop still sees the job as running."""
    from fray import RuntimeEnv
    from fray.jobs.local import LocalJobs

    jobs = LocalJobs(tmp_path / "jobs", stop_grace=0.5)
    job = jobs.start(["true"], RuntimeEnv())
    jobs.wait(job, timeout=60)
    unrelated = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        record = jobs._jobs[job]
        record.proc = unrelated  # the job's number, now another's group
        record.ended.clear()  # the stop came while the job was ending
        jobs.stop(job)
        assert unrelated.poll() is None, "LocalJobs.stop signalled a group that was not its job's"
    finally:
        unrelated.kill()
        unrelated.wait()
