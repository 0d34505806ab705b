"""A job that waits (create_job(..., after=[...])) seen from another process of its user on its host, through the
cluster's board (fray.jobs.wait_board): `fray job list` shows what it waits for, `fray job status` says it, `fray job
stop` stops it in the process that holds it, which learns it at once; a delete from elsewhere is refused, and the
board is empty once the holder has ended."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from _fray_cli import run_fray, state_env

from fray.errors import FrayError
from fray.in_memory.cluster import InMemoryClusterContext
from fray.types import JobStatus

pytestmark = pytest.mark.timeout(180)

HOLDER = """
import sys, fray
cluster = fray.cluster("in_memory")
prep = cluster.create_job([sys.executable, "-c", "import time; time.sleep(120)"], name="prep")
train = cluster.create_job("true", name="train", after=[prep])
print("ready", flush=True)
print(train.wait(120, raise_on_failure=False).status, flush=True)
sys.stdin.readline()  # (held until the test has read what it wants)
cluster.shutdown()
"""


def _listed(state: Path) -> list[str]:
    board = state / "job-waits"
    return [p.name for d in board.iterdir() for p in d.iterdir()] if board.exists() else []


def test_another_process_lists_stops_and_follows_a_waiting_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with state_env(tmp_path) as env:
        monkeypatch.setenv("FRAY_STATE_DIR", env["FRAY_STATE_DIR"])
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdin is not None
            assert holder.stdout.readline().strip() == "ready"
            listed = run_fray(env, "job", "list")
            assert listed.returncode == 0, listed.stderr
            header, *rows = listed.stdout.splitlines()
            assert "WAITS FOR" in header
            (row,) = [line for line in rows if line.startswith("train.1")]
            assert "PENDING" in row and "prep.1" in row
            status = run_fray(env, "job", "status", "train")
            assert "waits for: prep.1" in status.stdout, status.stdout + status.stderr
            here = InMemoryClusterContext()
            try:
                info = here.get_job("train")
                assert (info.id, info.status, info.waiting_for) == ("train.1", JobStatus.PENDING, ("prep.1",))
                with pytest.raises(FrayError, match=f"process {holder.pid}"):
                    here.delete_job("train")
                started = time.monotonic()
                stopped = run_fray(env, "job", "stop", "train")
                assert stopped.returncode == 0, stopped.stderr
                assert time.monotonic() - started < 30
                info = here.wait_job("train.1", timeout=30)
                assert info.status is JobStatus.STOPPED and "stopped before it started" in info.message
            finally:
                here.shutdown()
            assert holder.stdout.readline().strip() == "STOPPED"  # the holder learnt it: its wait ended
            assert _listed(Path(env["FRAY_STATE_DIR"]))  # its record, STOPPED, while the holder lives
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(60) == 0
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(30)
        assert _listed(Path(env["FRAY_STATE_DIR"])) == []  # the holder withdrew what it held as it shut down


def test_what_a_killed_holder_held_is_not_listed(tmp_path: Path) -> None:
    with state_env(tmp_path) as env:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
            assert _listed(Path(env["FRAY_STATE_DIR"]))
            holder.kill()  # (our own child) no shutdown: its record stays behind, stale
            holder.wait(30)
            listed = run_fray(env, "job", "list")
            assert "train.1" not in listed.stdout and "WAITS FOR" not in listed.stdout
            assert _listed(Path(env["FRAY_STATE_DIR"])) == []  # the reader removed it
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(30)
