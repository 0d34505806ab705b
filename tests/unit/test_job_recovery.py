"""A supervised job run again after every host of its running attempt was lost at once (a preempted Slurm
allocation, fray.jobs.recovery): which attempt is recorded lost, and the new supervisor (run for real, `python -m
fray.jobs.supervisor`) going on with the same numbering and budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fray.jobs.records import JobRecord, last_record, record_line
from fray.jobs.recovery import RECOVERY_VAR, lost_for_good, recovery_value
from fray.types import JobAttempt, JobStatus

REASON = "the Slurm job 7 of its hosts was preempted and requeued by Slurm"


def _log(*attempts: JobAttempt, after: str = "") -> str:
    return "out\n" + record_line(JobRecord(1, attempts)) + after


def _numbers(value: str) -> list[tuple[int, str, str]]:
    return [(a["number"], a["outcome"], a["message"]) for a in json.loads(value)]


def test_the_running_attempt_is_the_one_after_the_last_recorded() -> None:
    failed = JobAttempt(1, JobStatus.FAILED, 1, 10.0, 20.0, "it exited with code 1", "failed")
    value = recovery_value(_log(failed, after="[fray] attempt 2 of 3 (the last failed: ...)\n"), REASON, 5.0, 100.0)
    assert _numbers(value) == [(1, "failed", "it exited with code 1"), (2, "lost", f"lost: {REASON}")]
    assert json.loads(value)[1]["start_time"] == 20.0 and json.loads(value)[1]["end_time"] == 100.0
    first = recovery_value("no record yet\n", REASON, 5.0, 100.0)  # the first attempt ran
    assert _numbers(first) == [(1, "lost", f"lost: {REASON}")] and json.loads(first)[0]["start_time"] == 5.0


def test_an_attempt_the_supervisor_recorded_lost_to_the_same_preemption_is_that_loss() -> None:
    """Its supervisor got the preemption's SIGTERM and recorded the attempt lost; if it had not started another
    before the SIGKILL, that attempt is the one lost (named for the preemption); if it had, both are."""
    seen = JobAttempt(1, JobStatus.FAILED, None, 10.0, 95.0, "preempted: the supervisor got SIGTERM from pid 9", "lost")
    same = recovery_value(_log(seen), REASON, 5.0, 100.0)
    assert _numbers(same) == [(1, "lost", f"lost: {REASON} (its supervisor saw: {seen.message})")]
    begun = recovery_value(_log(seen, after="[fray] attempt 2 (the last was lost: ...)\n"), REASON, 5.0, 100.0)
    assert _numbers(begun) == [(1, "lost", seen.message), (2, "lost", f"lost: {REASON}")]
    earlier = recovery_value(_log(seen), REASON, 5.0, 95.0 + 61.0)  # another loss, a minute before
    assert [n for n, _, _ in _numbers(earlier)] == [1, 2]


def test_a_job_not_run_again_ends_with_a_final_record_saying_why() -> None:
    ending, message = lost_for_good("no record yet\n", REASON, 5.0, 100.0)
    record = last_record(ending)
    assert record is not None and [(a.number, a.outcome) for a in record.attempts] == [(1, "lost")]
    assert message == f"lost: {REASON}" and ending.endswith(f"[fray] the job ends: {message}\n")


def _supervise(recovery: str, recoveries: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "fray.jobs.supervisor", "--recoveries", str(recoveries)]
    argv += ["--", sys.executable, "-c", "import os; print('ran attempt', os.environ['FRAY_JOB_ATTEMPT'])"]
    env = {**os.environ, RECOVERY_VAR: recovery}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_a_supervisor_run_again_goes_on_with_the_attempts_and_budget_it_is_given() -> None:
    value = recovery_value("no record yet\n", REASON, 5.0, 100.0)
    done = _supervise(value, recoveries=1)
    assert done.returncode == 0, done.stderr
    assert f"[fray] attempt 2 (the last was lost: lost: {REASON}; recovery 1 of 1)" in done.stdout
    assert "ran attempt 2" in done.stdout
    record = last_record(done.stdout)
    assert record is not None
    assert [(a.number, a.outcome, a.world_size) for a in record.attempts] == [(1, "lost", 1), (2, "succeeded", 1)]
    over = _supervise(value, recoveries=0)  # the lost attempt spent the budget: nothing runs
    assert over.returncode == 1 and "ran attempt" not in over.stdout, over.stdout
    assert "[fray] the job ends: 1 lost attempts (max_recoveries=0)" in over.stdout
    ended = last_record(over.stdout)
    assert ended is not None and [a.outcome for a in ended.attempts] == ["lost"]
