"""A job's JobInfo as the ClusterContext gives it: what its backend knows, with its name (from its id) and, for a job
fray supervises, what its log's record says (fray.jobs.records): its attempts, result and error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fray.errors import JobNotFoundError
from fray.jobs.records import final_record, last_record
from fray.jobs.requests import SUPERVISOR, name_of
from fray.types import JobInfo

__all__ = ["RECORD_LINES", "log_end_with_record", "with_record"]


RECORD_LINES = 20  # a supervised job's record is usually among its log's last lines (only stragglers write after it)
_LONGER_ENDS = (2_000, 200_000)  # lines read next where it is not: each read bounded, a huge log never read whole


def log_end_with_record(read: Callable[[int], str], final: bool = False) -> str:
    """The end of a job's raw log that holds its last record (`final`: its final one), where it has one: a long
    attempt writes much after the record of the one before, and an ended job's engine or stragglers may write a
    screenful after the final one. `read(lines)` reads the log's last lines."""
    found = final_record if final else last_record
    text = ""
    for lines in (RECORD_LINES, *_LONGER_ENDS):
        text = read(lines)
        if found(text) is not None:
            break
    return text


def with_record(info: JobInfo, log_end: Callable[[str, int], str]) -> JobInfo:
    """info with its name, and (for a supervised job) what its log's record says; `log_end(id, lines)` reads the
    end of a job's raw log."""
    parsed = name_of(info.id)
    if parsed is not None:
        info = replace(info, name=parsed[0])
    if " ".join(SUPERVISOR) not in info.entrypoint:
        return info
    try:
        if info.status.is_terminal:  # (read once it ended: a running job's info reads only its log's end)
            record = last_record(log_end_with_record(lambda lines: log_end(info.id, lines), final=True))
        else:
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
