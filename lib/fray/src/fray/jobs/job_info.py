"""A job's JobInfo as the ClusterContext gives it: what its backend knows, with its name (from its id) and, for a job
fray supervises, what its log's record says (fray.jobs.records): its attempts, result and error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fray.errors import JobNotFoundError
from fray.jobs.records import last_record
from fray.jobs.requests import SUPERVISOR, name_of
from fray.types import JobInfo

__all__ = ["RECORD_LINES", "with_record"]


RECORD_LINES = 20  # a supervised job's record is among its log's last lines (only stragglers write after it)


def with_record(info: JobInfo, log_end: Callable[[str, int], str]) -> JobInfo:
    """info with its name, and (for a supervised job) what its log's record says; `log_end(id, lines)` reads the
    end of a job's raw log."""
    parsed = name_of(info.id)
    if parsed is not None:
        info = replace(info, name=parsed[0])
    if " ".join(SUPERVISOR) not in info.entrypoint:
        return info
    try:
        record = last_record(log_end(info.id, RECORD_LINES))
    except JobNotFoundError:
        return info
    if record is None:
        return info
    message = info.message
    if record.attempts and record.attempts[-1].message and info.status.is_terminal:
        message = record.attempts[-1].message
    if record.result_repr is not None:
        message = f"returned {record.result_repr} (not plain data: kept as its repr)"
    return replace(
        info,
        replicas=record.replicas,
        attempts=record.attempts,
        result=record.result,
        error=record.error,
        message=message,
    )
