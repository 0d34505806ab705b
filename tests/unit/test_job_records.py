"""A job's record, read back from what its log holds (fray.jobs.records): whatever a job prints, a malformed record
is ignored and never an error for the reader, and a record printed after the supervisor's final one (by a process
the job left running) does not replace it. The supervisor runs for real (`python -m fray.jobs.supervisor`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from fray.jobs.job_info import RECORD_LINES, with_record
from fray.jobs.records import RECORD_MAX, JobRecord, last_record, record_line
from fray.jobs.requests import SUPERVISOR
from fray.types import JobAttempt, JobInfo, JobStatus

START, END = "\x1b]fray-job;", "\x07"


def _record(number: int, status: JobStatus = JobStatus.SUCCEEDED) -> JobRecord:
    attempts = tuple(JobAttempt(i, status, 0, 1.0, 2.0, f"attempt {i}") for i in range(1, number + 1))
    return JobRecord(1, attempts)


@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000 + "]" * 100_000,  # RecursionError in json
        '{"replicas":1,"attempts":[{"number":1e400,"status":"SUCCEEDED"}]}',  # OverflowError: int(inf)
        '{"replicas":1e400,"attempts":[]}',
        '{"replicas":1,"attempts":[],"error":{"type":"x","message":"y","rank":1e999}}',
        '{"replicas":1,"attempts":[],"result":"gASVCAAAAAAAAACMBG9zLnN5c3RlbZSTlC4="}',  # a global in the pickle
        '{"replicas":1,"attempts":[],"result":"!!!"}',
        '{"replicas":1,"attempts":{"a":1}}',
        '"just a string"',
        '{"replicas":1,"attempts":[' + '{"number":1,"status":"SUCCEEDED"},' * 3 + "null]}",
    ],
)
def test_a_malformed_record_is_ignored_and_the_good_one_before_it_read(body: str) -> None:
    good = record_line(_record(2))
    found = last_record(good + "\nsome output\n" + START + body + END + "\n")
    assert found is not None and [a.number for a in found.attempts] == [1, 2]


def test_a_record_longer_than_the_bound_is_not_read_and_costs_little() -> None:
    good = record_line(_record(1))
    huge = START + '{"replicas":1,"attempts":[],"result_repr":"' + "x" * (RECORD_MAX + 10) + '"}' + END
    start = time.monotonic()
    found = last_record(good + huge)
    assert time.monotonic() - start < 2.0
    assert found is not None and found.result_repr is None and len(found.attempts) == 1


def test_a_record_printed_after_the_final_one_does_not_replace_it() -> None:
    final = record_line(_record(2), final=True)
    later = record_line(_record(5, JobStatus.FAILED))  # what a survivor of the job prints, final flag or not
    later_final = record_line(_record(7, JobStatus.FAILED), final=True)
    for log in (final + later, final + "\n" + later_final, record_line(_record(1)) + final + later):
        found = last_record(log)
        assert found is not None and len(found.attempts) == 2 and found.attempts[-1].status is JobStatus.SUCCEEDED
    running = last_record(record_line(_record(1)) + record_line(_record(2)))  # no final yet: the latest
    assert running is not None and len(running.attempts) == 2


def test_a_real_supervisors_final_record_outlives_a_grandchilds_fake_one() -> None:
    fake = record_line(_record(9, JobStatus.FAILED), final=True)
    survivor = textwrap.dedent(
        f"""
        import os, sys, time
        if os.fork() == 0:  # a grandchild the job leaves running: it prints after the supervisor's last record
            time.sleep(1.0)
            sys.stdout.write({fake!r})
            sys.stdout.flush()
            os._exit(0)
        """
    )
    done = subprocess.run(
        [sys.executable, "-m", "fray.jobs.supervisor", "--", sys.executable, "-c", survivor],
        capture_output=True,
        text=True,
        timeout=60,
    )  # (the pipe stays open until the grandchild ends: its output is here too)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count(START) == 2
    found = last_record(done.stdout)
    assert found is not None
    assert [(a.number, a.status) for a in found.attempts] == [(1, JobStatus.SUCCEEDED)]


def test_an_ended_jobs_record_is_found_behind_many_lines_written_after_it() -> None:
    """An ended job's record is read however many lines follow it: its supervisor's engine (Ray's driver messages
    at its shutdown), or a process the job left running, may write a screenful after the final record."""
    record = JobRecord(2, (JobAttempt(1, JobStatus.FAILED, None, 1.0, 2.0, "lost: rank 1's node", "lost"),))
    raw = "rank 0 on h1\n" + record_line(record, None, final=True) + "".join(f"straggler {i}\n" for i in range(300))
    asked: list[int] = []

    def log_end(job_id: str, lines: int) -> str:
        asked.append(lines)
        return "".join(raw.splitlines(keepends=True)[-lines:])

    entrypoint = " ".join([sys.executable, *SUPERVISOR, "--replicas", "2", "--", "true"])
    ended = with_record(JobInfo("j", JobStatus.SUCCEEDED, entrypoint=entrypoint, message="Job finished."), log_end)
    assert [a.outcome for a in ended.attempts] == ["lost"] and ended.replicas == 2, (ended, asked)
    running = with_record(JobInfo("j", JobStatus.RUNNING, entrypoint=entrypoint), log_end)
    assert running.attempts == () and asked[-1] == RECORD_LINES, "a running job's info reads only the log's end"
