"""A supervised job run again after every host of its running attempt was lost at once (a Slurm allocation
preempted and requeued, its job's supervisor gone with it): the backend reads the job's record from its log, which
outlived the hosts, and starts a new supervisor with FRAY_JOB_RECOVERY, the attempts so far with the one that was
running last, `lost`. The new supervisor goes on from there: one record, one numbering, one budget
(fray.jobs.outcomes.next_step) across the hosts' lives."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from fray.host import settings
from fray.jobs.job_info import log_end_with_record
from fray.jobs.records import JobRecord, final_record, last_record, record_line
from fray.jobs.requests import SUPERVISOR
from fray.types import JobAttempt, JobStatus

__all__ = [
    "RECOVERY_VAR",
    "ended_before",
    "has_record",
    "is_supervised",
    "log_end_with_record",
    "lost_for_good",
    "recovered_attempts",
    "recovery_value",
]

RECOVERY_VAR = settings.JOB_RECOVERY.name
# Seconds before its hosts were seen gone within which an attempt its supervisor recorded lost is the one their loss
# ended: a scheduler's SIGTERM comes that long (Slurm's KillWait, 30 s by default) before the SIGKILL that ends it.
SAME_LOSS = 60.0


def is_supervised(entrypoint: str) -> bool:
    """Whether a job's entrypoint (JobInfo.entrypoint) runs it under fray.jobs.supervisor."""
    return " ".join(SUPERVISOR) in entrypoint


def ended_before(log_tail: str) -> JobRecord | None:
    """The final record in this end of a job's raw log: the job had ended before its hosts were lost."""
    return final_record(log_tail)


def has_record(log_tail: str) -> bool:
    """Whether this end of a job's raw log holds a record (its attempts so far) of its supervisor."""
    return last_record(log_tail) is not None


def _with_lost(log_tail: str, reason: str, started: float | None, lost_at: float) -> tuple[int, list[JobAttempt]]:
    """The attempts the record at the end of a job's log holds, and the attempt that was running when its hosts
    went, `lost` with `reason`; and the record's ranks. `started`: when the job started, for a first attempt. The
    attempt that was running is the one after the last recorded where its supervisor had started it (its line
    `[fray] attempt N` is in the log), else the last recorded where it was recorded lost less than SAME_LOSS s
    before `lost_at` (the supervisor got the SIGTERM that took its hosts, and the SIGKILL came before it started
    another), else the first."""
    record = last_record(log_tail)
    attempts = list(record.attempts) if record is not None else []
    replicas = record.replicas if record is not None else 1
    last = attempts[-1] if attempts else None
    begun = f"[fray] attempt {len(attempts) + 1} " in log_tail
    if last is not None and last.outcome == "lost" and (last.end_time or 0.0) >= lost_at - SAME_LOSS and not begun:
        attempts[-1] = replace(last, message=f"lost: {reason} (its supervisor saw: {last.message})")
        return replicas, attempts
    since = last.end_time if last is not None and last.end_time is not None else started
    lost = JobAttempt(len(attempts) + 1, JobStatus.FAILED, None, since, lost_at, f"lost: {reason}", "lost")
    return replicas, [*attempts, lost]


def recovery_value(log_tail: str, reason: str, started: float | None, lost_at: float) -> str:
    """FRAY_JOB_RECOVERY for the next run of a job whose log ends with `log_tail` (see _with_lost)."""
    return json.dumps([_plain(a) for a in _with_lost(log_tail, reason, started, lost_at)[1]])


def lost_for_good(log_tail: str, reason: str, started: float | None, lost_at: float) -> tuple[str, str]:
    """What ends the log of a supervised job that is not run again after its hosts were lost: its final record,
    the attempt that ran then `lost` with `reason` (see _with_lost), and the line that says so; and that message."""
    replicas, attempts = _with_lost(log_tail, reason, started, lost_at)
    message = attempts[-1].message
    return record_line(JobRecord(replicas, tuple(attempts)), final=True) + f"[fray] the job ends: {message}\n", message


def _plain(attempt: JobAttempt) -> dict[str, Any]:
    return {
        "number": attempt.number,
        "status": attempt.status.value,
        "exit_code": attempt.exit_code,
        "start_time": attempt.start_time,
        "end_time": attempt.end_time,
        "message": attempt.message,
        "outcome": attempt.outcome,
        "grace": attempt.grace,
        "world_size": attempt.world_size,
    }


def recovered_attempts(world_size: int) -> list[JobAttempt]:
    """The attempts FRAY_JOB_RECOVERY carries (none where it is unset), each with a world size (the lost one's,
    where the backend could not tell: `world_size`). ValueError where it is not what recovery_value makes."""
    text = settings.JOB_RECOVERY.read()
    if text is None:
        return []
    try:
        return [
            JobAttempt(
                number=int(a["number"]),
                status=JobStatus(a["status"]),
                exit_code=None if a.get("exit_code") is None else int(a["exit_code"]),
                start_time=None if a.get("start_time") is None else float(a["start_time"]),
                end_time=None if a.get("end_time") is None else float(a["end_time"]),
                message=str(a.get("message", "")),
                outcome=str(a.get("outcome", "")),
                grace=None if a.get("grace") is None else float(a["grace"]),
                world_size=world_size if a.get("world_size") is None else int(a["world_size"]),
            )
            for a in json.loads(text)
        ]
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise ValueError(f"{RECOVERY_VAR} is not a list of attempts: {exc}") from None
