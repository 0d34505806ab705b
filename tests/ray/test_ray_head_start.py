"""A private Ray head's start and its dashboard's end (fray_ray._head.LocalHead): the head is ready once `ray start`
says its node is up, not when its Job API first answers; a start Ray gave up on (its raylet not registered in its
fixed 30 s, as on a loaded machine) is made once more; a head whose dashboard ended stops and says so. Real Ray."""

from __future__ import annotations

import logging
import os
import signal
import time
from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("fray_ray")

import fray
from fray.host import procfs
from fray_ray import _head

SMALL = {"num_cpus": 1, "object_store_memory": 80_000_000}


def _members(head: _head.LocalHead, program: str) -> list[int]:
    """The processes of the head's own group running `program` (a path ending one of its first three words)."""
    found = []
    for pid in procfs.group_members(head.proc.pid):
        argv = procfs.cmdline(pid) or []
        if any(arg.endswith(program) for arg in argv[:3]):
            found.append(pid)
    return found


def _wait_for_member(head: _head.LocalHead, program: str, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while not (found := _members(head, program)):
        if time.monotonic() > deadline:
            log = Path(head.log_path).read_text(errors="replace")[-2000:]
            raise AssertionError(f"no {program} in the head's group; ray start said: {log}")
        time.sleep(0.005)  # (the raylet is to be caught before it registers)
    return found[0]


def test_a_start_ray_gave_up_on_is_made_again(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    head = _head.LocalHead(**SMALL)  # type: ignore[arg-type]
    try:
        first = head.proc.pid
        raylet = _wait_for_member(head, "raylet/raylet")
        os.kill(raylet, signal.SIGSTOP)  # (of our own head's group) it never registers: Ray gives up after 30 s
        with caplog.at_level(logging.WARNING, logger="fray_ray"):
            client = head.wait_ready(partial(_head.job_client, own=True))
        if head.proc.pid == first and b"Ray runtime started." in Path(head.log_path).read_bytes():
            pytest.skip("the raylet registered before the test stopped it: Ray did not give up this time")
        assert head.proc.pid != first and any("starting it again" in r.getMessage() for r in caplog.records)
        assert b"Ray runtime started." in Path(head.log_path).read_bytes()
        assert client.list_jobs() == [] and head.proc.poll() is None
        assert not procfs.group_members(first), "the first start's processes are gone"
    finally:
        head.stop()
    assert not procfs.group_members(head.proc.pid) and not os.path.exists(head.temp_dir)


def test_a_head_is_ready_once_its_node_is_up_and_one_whose_dashboard_ended_says_so() -> None:
    """Its Job API answers before `ray start` has seen its raylet register: ready means both. Once up, `ray start
    --block` stops the whole head when its dashboard ends: a call to the Job API then says the head stopped, with
    the end of its logs naming the dashboard, rather than Ray's bare 'connection refused'."""
    with fray.cluster("ray?num_cpus=1&object_store_memory=80000000") as cluster:
        head = cluster._head  # type: ignore[attr-defined]
        assert b"Ray runtime started." in Path(head.log_path).read_bytes()
        os.kill(_wait_for_member(head, "dashboard/dashboard.py", timeout=0), signal.SIGKILL)  # (of our own head)
        head.proc.wait(timeout=60)
        with pytest.raises(fray.FrayError, match="this private Ray head has stopped") as raised:
            cluster.list_jobs()
        said = str(raised.value)
        assert "ray-start.log" in said and "exited unexpectedly" in said and "dashboard" in said, said
    assert not procfs.group_members(head.proc.pid) and not os.path.exists(head.temp_dir)
