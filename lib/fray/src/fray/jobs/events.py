"""A cluster's jobs as events (`Kind.JOB_STATE`), derived from what the cluster recorded (`list_jobs()`).

Jobs are not recorded as they change (the cluster keeps their times, and a `fray` command that asks may start
long after): this turns a list of `JobInfo` into one `ProcessEvents` of a "jobs" process, one thread per job, with
the times the cluster recorded, so that fray.telemetry.timeline draws a cluster's jobs as it draws a job's tasks:

- submitted: `{"state": "PENDING"}` at its submission time;
- each attempt: `{"state": "RUNNING", "attempt": n}` at its start, `{"state": how it ended, "attempt": n,
  "exit_code", "message"}` at its end (none while it runs);
- ended: `{"state": its final state, "exit_code", "message"}` at its end time.

A job fray does not supervise records no attempts (`JobInfo.attempts` is empty): its start and end are its one
attempt (`attempts_of`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

from fray.telemetry.events import Event, Kind, ProcessEvents
from fray.types import JobAttempt, JobInfo, JobStatus

__all__ = ["JOBS_LABEL", "attempts_of", "job_events", "job_label"]

JOBS_LABEL = "jobs"  # the process the jobs' lanes are drawn in


def job_label(info: JobInfo) -> str:
    """What a job is called on a lane: its name, else its entrypoint (cut), with its id."""
    what = info.name or info.entrypoint or info.id
    if len(what) > 60:
        what = what[:57] + "..."
    return what if what == info.id else f"{what} ({info.id})"


def attempts_of(info: JobInfo) -> tuple[JobAttempt, ...]:
    """The job's attempts as the cluster recorded them; for a job with none recorded, its own start and end as
    its one attempt (none before it started)."""
    if info.attempts:
        return info.attempts
    if info.start_time is None:
        return ()
    running = info.status in (JobStatus.PENDING, JobStatus.RUNNING)
    return (
        JobAttempt(
            1,
            JobStatus.RUNNING if running else info.status,
            None if running else info.exit_code,
            info.start_time,
            None if running else info.end_time,
            "" if running else info.message,
        ),
    )


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


def _outcome(state: JobStatus, exit_code: int | None, message: str, attempt: int | None) -> dict[str, Any]:
    data: dict[str, Any] = {"state": state.value}
    if attempt is not None:
        data["attempt"] = attempt
    if exit_code is not None:
        data["exit_code"] = exit_code
    if message:
        data["message"] = message
    return data


def job_events(jobs: Sequence[JobInfo], host: str | None = None) -> ProcessEvents:
    """The jobs' state changes as one process's events (a lane per job, thread 1, 2, ... in the order given),
    in time order. Times the cluster did not record are left out, never made up."""
    raw: list[tuple[int, str, str, int, dict[str, Any]]] = []  # (t, key, name, thread, data)
    threads: dict[int, str] = {}
    for thread, info in enumerate(jobs, start=1):
        threads[thread] = job_label(info)
        name = info.name or info.entrypoint or info.id
        submitted = _ns(info.submission_time)
        if submitted is not None:
            raw.append((submitted, info.id, name, thread, {"state": JobStatus.PENDING.value}))
        for attempt in attempts_of(info):
            started = _ns(attempt.start_time)
            if started is None:
                continue
            raw.append((started, info.id, name, thread, {"state": JobStatus.RUNNING.value, "attempt": attempt.number}))
            ended = _ns(attempt.end_time)
            if ended is not None and attempt.status.is_terminal:
                data = _outcome(attempt.status, attempt.exit_code, attempt.message, attempt.number)
                raw.append((max(ended, started), info.id, name, thread, data))
        ended = _ns(info.end_time)
        if ended is not None and info.status.is_terminal:
            raw.append((ended, info.id, name, thread, _outcome(info.status, info.exit_code, info.message, None)))
    raw.sort(key=lambda r: r[0])  # (stable: a job's attempt end comes before its final state at the same time)
    events = [
        Event(seq, t, Kind.JOB_STATE, key, name, thread, data)
        for seq, (t, key, name, thread, data) in enumerate(raw, start=1)
    ]
    return ProcessEvents(host or socket.gethostname(), os.getpid(), JOBS_LABEL, threads, events)
