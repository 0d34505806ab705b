"""A job's failure classes, budgets and grace (fray.jobs.policy, fray.jobs.outcomes): options checked at submission,
outcomes on the record, and a detached job's stop told from a preemption."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

import fray
from fray import JobStatus, RuntimeEnv
from fray.jobs.outcomes import next_step
from fray.jobs.policy import JobPolicy, grace_of, shell_code
from fray.jobs.records import JobRecord, last_record, record_line
from fray.types import JobAttempt

PY = shlex.quote(sys.executable)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"max_retries": 1, "retry_on_exit_codes": [3], "no_retry_on_exit_codes": [4]}, ValueError, "not both"),
        ({"retry_on_exit_codes": [3]}, ValueError, "max_retries=0 retries none"),
        ({"max_retries": 1, "retry_on_exit_codes": [0]}, ValueError, "ints 1-255"),
        ({"max_retries": 1, "no_retry_on_exit_codes": [256]}, ValueError, "ints 1-255"),
        ({"max_retries": 1, "retry_on_exit_codes": []}, ValueError, "empty"),
        ({"max_retries": 1, "retry_on_exit_codes": "3"}, TypeError, "list of exit codes"),
        ({"max_recoveries": -1}, ValueError, "max_recoveries must be >= 0"),
        ({"max_recoveries": 1.5}, TypeError, "max_recoveries must be an int"),
        ({"max_retries": -1}, ValueError, "max_retries must be >= 0"),
        ({"stop_grace": -1}, ValueError, "stop_grace must be between 0 and 3600"),
        ({"stop_grace": "5"}, TypeError, "stop_grace must be a number"),
    ],
)
def test_bad_budgets_and_grace_are_refused_at_submission(options: dict[str, object], error: type, match: str) -> None:
    with fray.cluster("in_memory") as cluster, pytest.raises(error, match=match):
        cluster.create_job("true", **options)  # type: ignore[arg-type]


def _attempt(outcome: str, code: int | None = None) -> JobAttempt:
    status = {"succeeded": JobStatus.SUCCEEDED, "stopped": JobStatus.STOPPED}.get(outcome, JobStatus.FAILED)
    return JobAttempt(1, status, code, outcome=outcome)


def test_failures_and_losses_have_their_own_budgets() -> None:
    policy = JobPolicy.of(1, 2, None, None, None)
    assert next_step(policy, [_attempt("lost"), _attempt("lost")]) is None  # losses do not touch max_retries
    assert next_step(policy, [_attempt("lost"), _attempt("lost"), _attempt("lost")]) == (
        "3 lost attempts (max_recoveries=2)"
    )
    assert next_step(policy, [_attempt("lost"), _attempt("failed", 1)]) is None
    assert next_step(policy, [_attempt("failed", 1), _attempt("lost"), _attempt("failed", 1)]) == (
        "2 failed attempts (max_retries=1)"
    )
    assert next_step(policy, [_attempt("stopped")]) == "stopped"
    only = JobPolicy.of(5, None, [3, 137], None, None)
    assert next_step(only, [_attempt("failed", 3)]) is None
    assert next_step(only, [_attempt("failed", -9)]) is None  # killed by SIGKILL: 128 + 9, as a shell says
    assert next_step(only, [_attempt("failed", 4)]) == "exit code 4 is not retried"
    assert shell_code(-15) == 143 and shell_code(2) == 2


def test_an_attempts_outcome_and_grace_travel_on_the_record() -> None:
    attempts = (JobAttempt(1, JobStatus.FAILED, None, 1.0, 2.0, "preempted", "lost", 3.25),)
    record = last_record(record_line(JobRecord(1, attempts), final=True))
    assert record is not None and record.attempts == attempts


def test_grace_is_read_back_from_a_supervised_entrypoint() -> None:
    assert grace_of("python -m fray.jobs.supervisor --recoveries 10 --grace 12.5 -- sh -c 'x --grace 99'") == 12.5
    assert grace_of("python -m fray.jobs.supervisor -- sh -c 'x --grace 99'") == 5.0


def test_a_plain_command_is_supervised_once_a_budget_or_grace_is_given() -> None:
    with fray.cluster("in_memory") as cluster:
        assert "fray.jobs.supervisor" not in cluster.create_job("true").info().entrypoint
        for options in ({"max_recoveries": 3}, {"stop_grace": 1.0}):
            info = cluster.create_job("true", **options).wait(60)  # type: ignore[arg-type]
            assert "fray.jobs.supervisor" in info.entrypoint and [a.outcome for a in info.attempts] == ["succeeded"]


def test_a_detached_jobs_stop_from_another_process_is_a_stop_not_a_preemption(tmp_path: Path) -> None:
    """A detached job is stopped by whichever process asks, not its parent: its stop mark says it is fray's."""
    with fray.cluster("in_memory") as cluster:
        job = cluster.create_job(
            f"{PY} -c 'import time; print(\"up\", flush=True); time.sleep(300)'", detached=True, stop_grace=2
        )
        deadline = time.monotonic() + 30
        while "up" not in job.logs():
            assert time.monotonic() < deadline, "the detached job did not start"
            time.sleep(0.05)
        job.stop()
        info = job.info()
        assert info.status is JobStatus.STOPPED
        assert [a.outcome for a in info.attempts] == ["stopped"], info.attempts


def test_a_supervised_job_with_packages_is_its_shells_own_process(tmp_path: Path) -> None:
    """With packages the job's command is `install && ...`: an argv is exec'd, so the job's first process is the
    supervisor, which its stop signals alone (a shell in between would die at the SIGTERM and cut the grace)."""
    from fray.jobs.local import job_command

    argv, shell = job_command(
        [sys.executable, "-m", "fray.jobs.supervisor", "--", "true"], RuntimeEnv(["six"]), tmp_path
    )
    assert shell and argv[0].endswith(
        f"&& {{ exec {shlex.join([sys.executable, '-m', 'fray.jobs.supervisor'])} -- true\n}}"
    )
    (text, _) = job_command("echo a; echo b", RuntimeEnv(["six"]), tmp_path)
    assert text[0].endswith("&& { echo a; echo b\n}")  # a shell command stays a shell's
