"""`fray job submit` with a job's shape (issue 30): --name, --retries, --replicas, --call, resources; `fray job
list|status|logs` showing names, attempts, ranks and tails; and one name submitted from 4 processes at once making
one job, on each backend where other processes reach the jobs (in_memory's state directory, a monarch head; the
Ray cluster's case is in tests/test_cli_jobs.py, on that module's one Ray head). The real `fray` entry point in
subprocesses, each test with a state directory of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from _fray_cli import race_one_name, run_fray, state_env

TRAIN = """\
import os

def main(*words):
    print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "attempt", os.environ["FRAY_JOB_ATTEMPT"],
          words, flush=True)
    if os.environ["RANK"] == "1" and os.environ["FRAY_JOB_ATTEMPT"] == "1":
        raise SystemExit(4)
    return len(words)
"""


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    with state_env(tmp_path) as env:
        yield env


_fray = partial(run_fray, timeout=180)


def test_submit_a_named_retried_two_rank_call_then_list_status_and_tail(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    done = _fray(
        env, "job", "submit", "--name", "demo", "--replicas", "2", "--retries", "1", "--call", "train:main",
        "--", "a", "b", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[rank 1] rank 1 of 2 attempt 2 ('a', 'b')" in done.stdout, done.stdout
    assert "[fray] attempt 2 of 2" in done.stdout
    listed = _fray(env, "job", "list")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("demo.1"))
    assert row.split()[1:5] == ["demo", "SUCCEEDED", "2", "2"], listed.stdout  # name, status, attempts, ranks
    status = json.loads(_fray(env, "job", "status", "demo", "--json").stdout)
    assert status["name"] == "demo" and status["result"] == 2 and status["replicas"] == 2
    assert [a["exit_code"] for a in status["attempts"]] == [4, 0]
    text = _fray(env, "job", "status", "demo").stdout
    assert "attempt 1: FAILED exit code 4 rank 1 exited with code 4 [failed]" in text and "result: 2" in text, text
    assert "attempt 2: SUCCEEDED exit code 0 [succeeded]" in text, text
    tail = _fray(env, "job", "logs", "demo", "--tail", "1")
    assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 1 and "attempt 2" in tail.stdout


def test_bad_shapes_are_refused_as_usage_errors(env: dict[str, str], tmp_path: Path) -> None:
    assert _fray(env, "job", "submit", "--replicas", "0", "--", "true").returncode == 2
    assert _fray(env, "job", "submit", "--retries", "-1", "--", "true").returncode == 2
    missing = _fray(env, "job", "submit", "--call", "no_such_module:main", cwd=tmp_path)
    assert missing.returncode == 2 and "no_such_module" in missing.stderr, missing.stderr
    assert _fray(env, "job", "submit", "--call", "nocolon").returncode == 2
    assert _fray(env, "job", "submit", "--resource", "GPUx", "--", "true").returncode == 2
    unknown = _fray(env, "job", "status", "no-such-job")
    assert unknown.returncode == 1 and "no-such-job" in unknown.stderr


def _id_in(stderr: str) -> str:
    """The job id in `fray: job ID submitted ...`."""
    return next(
        line.split()[2] for line in stderr.splitlines() if line.startswith("fray: job ") and "submitted" in line
    )


def test_one_name_from_four_processes_is_one_job_in_memory(env: dict[str, str]) -> None:
    assert race_one_name(env, [], "race") == {"race.1"}
    listed = json.loads(_fray(env, "job", "list", "--json").stdout)
    assert [job["id"] for job in listed if job["name"] == "race"] == ["race.1"]
    assert _fray(env, "job", "stop", "race").returncode == 0


def test_one_name_from_four_processes_is_one_job_on_a_monarch_head(env: dict[str, str]) -> None:
    pytest.importorskip("fray_monarch")
    started = _fray(env, "cluster", "start", "--backend", "monarch?procs=1", timeout=240)
    assert started.returncode == 0, started.stderr
    try:
        assert race_one_name(env, ["--backend", "monarch"], "race", each=2) == {"race.1"}
        listed = json.loads(_fray(env, "job", "list", "--backend", "monarch", "--json").stdout)
        assert [job["id"] for job in listed if job["name"] == "race"] == ["race.1"]
        # a supervised job of the head: its record (attempts) reaches this client through the head
        retried = _fray(env, "job", "submit", "--backend", "monarch", "--retries", "1", "--", "sh", "-c", "exit 5")
        assert retried.returncode == 5, retried.stderr
        status = json.loads(
            _fray(env, "job", "status", "--backend", "monarch", "--json", _id_in(retried.stderr)).stdout
        )
        assert [a["exit_code"] for a in status["attempts"]] == [5, 5]
    finally:
        assert _fray(env, "cluster", "stop", "--backend", "monarch").returncode == 0


def test_submit_with_budgets_and_grace_then_status_shows_each_attempts_class(
    env: dict[str, str], tmp_path: Path
) -> None:
    codes = "import os, sys; sys.exit([3, 4][int(os.environ['FRAY_JOB_ATTEMPT']) - 1])"
    done = _fray(
        env, "job", "submit", "--name", "codes", "--retries", "5", "--retry-on-exit-codes", "3", "--recoveries", "2",
        "--grace", "1.5", "--", "python", "-c", codes,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr  # 3 was retried, 4 was not
    text = _fray(env, "job", "status", "codes").stdout
    assert "--recoveries 2 --grace 1.5 --retry-on-exit-codes 3" in text, text
    assert "attempt 1: FAILED exit code 3 it exited with code 3 [failed]" in text, text
    assert "attempt 2: FAILED exit code 4 it exited with code 4 [failed]" in text, text
    both = _fray(env, "job", "submit", "--retries", "1", "--retry-on-exit-codes", "3", "--no-retry-on-exit-codes",
                 "4", "--", "true")  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr
    bad = _fray(env, "job", "submit", "--retries", "1", "--retry-on-exit-codes", "x", "--", "true")
    assert bad.returncode == 2 and "separated by commas" in bad.stderr, bad.stderr


def test_retry_starts_a_finished_job_again_and_refuses_a_running_one(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    done = _fray(env, "job", "submit", "--name", "again", "--call", "train:main", "--", "x", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    retried = _fray(env, "job", "retry", "again")
    assert retried.returncode == 0 and retried.stdout.strip() == "again.2", retried.stderr
    waited = _fray(env, "job", "logs", "again.2", "--follow")
    assert "attempt 1 ('x',)" in waited.stdout, waited.stdout
    status = json.loads(_fray(env, "job", "status", "again", "--json").stdout)
    assert status["id"] == "again.2" and status["status"] == "SUCCEEDED" and status["result"] == 1
    running = _fray(env, "job", "submit", "--no-wait", "--name", "busy", "--", "sleep", "300")
    assert running.returncode == 0, running.stderr
    refused = _fray(env, "job", "retry", "busy")
    assert refused.returncode == 1 and "stop it first" in refused.stderr, refused.stderr
    assert _fray(env, "job", "stop", "busy").returncode == 0
