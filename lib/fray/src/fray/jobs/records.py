"""The record a supervised job (fray.jobs.supervisor) keeps in its own log: its attempts, its callable's result or
exception. Written to the job's stdout, so it reaches every backend's log the same way, and read back from the log's
tail by the ClusterContext (JobInfo.attempts, .result, .error).

A record is a terminal OSC sequence, `ESC ] fray-job ; <json> BEL`, so `get_job_logs` (which gives
plain text: fray.jobs.plain_text) shows none of it. The supervisor writes a full record after each attempt (every
attempt so far), so the last one in the log is the whole story.

A callable's return value crosses as plain data only (None, bool, int, float, complex, str, bytes, and lists,
tuples, sets, frozensets and dicts of them): it is read back with an unpickler that refuses every global, so
reading a job's record never runs code, whatever the log holds (a job may print anything). Other values are kept
as their repr. A job may print a line that looks like a record: the reader takes the last well-formed one, so a
job can misstate its own attempts, never make its reader run anything. The supervisor marks its last record
`final`, and the first final record in a log is the one read: a record printed after it (by a process the job left
running) does not replace it. A malformed record (longer than RECORD_MAX, deeper than JSON can be read, numbers
out of range, anything that raises) is ignored, never an error for whoever reads the job.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
from dataclasses import dataclass
from typing import Any

from fray.types import JobAttempt, JobError, JobStatus

__all__ = ["JobRecord", "dump_plain", "final_record", "last_record", "load_plain", "record_line"]

_START = "\x1b]fray-job;"
_END = "\x07"
RECORD_MAX = 1024 * 1024  # characters of a record's JSON; a longer one is not read
_RECORD = re.compile(re.escape(_START) + rf"([^\x07\x1b\n]{{0,{RECORD_MAX}}})" + re.escape(_END))
RESULT_MAX = 64 * 1024  # bytes of a pickled result kept on the record; a bigger one is kept as its repr
REPR_MAX = 2000


@dataclass(frozen=True)
class JobRecord:
    replicas: int
    attempts: tuple[JobAttempt, ...]
    result: Any = None
    result_repr: str | None = None  # a return value that is not plain data, as its repr
    error: JobError | None = None


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a job's result must be plain data, not {module}.{name}")


_PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def _is_plain(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN_SCALARS) and type(value) in _PLAIN_SCALARS:
        return True
    if depth > 32:
        return False
    if type(value) in (list, tuple, set, frozenset):
        return all(_is_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def dump_plain(value: Any) -> bytes | None:
    """value's pickle where it is plain data and small enough to keep (RESULT_MAX), else None."""
    if not _is_plain(value):
        return None
    try:
        data = pickle.dumps(value, protocol=4)
    except (pickle.PicklingError, RecursionError, ValueError):
        return None
    return data if len(data) <= RESULT_MAX else None


def load_plain(data: bytes) -> Any:
    """What dump_plain made; UnpicklingError for anything that would name a class or function."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a repr that raises: say so rather than fail the job
        text = f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= REPR_MAX else text[: REPR_MAX - 3] + "..."


def record_line(record: JobRecord, result_data: bytes | None = None, final: bool = False) -> str:
    """The log line that carries `record` (its result as dump_plain's bytes, else its result_repr); `final`: the
    supervisor writes no record after this one."""
    body: dict[str, Any] = {
        "replicas": record.replicas,
        "attempts": [
            {
                "number": a.number,
                "status": a.status.value,
                "exit_code": a.exit_code,
                "start_time": a.start_time,
                "end_time": a.end_time,
                "message": a.message,
                "outcome": a.outcome,
                "grace": a.grace,
                "world_size": a.world_size,
            }
            for a in record.attempts
        ],
    }
    if result_data is not None:
        body["result"] = base64.b64encode(result_data).decode()
    elif record.result_repr is not None:
        body["result_repr"] = record.result_repr
    if final:
        body["final"] = True
    if record.error is not None:
        e = record.error
        body["error"] = {"type": e.type, "message": e.message, "traceback": e.traceback, "rank": e.rank}
    # No newline after it: the log's plain text (get_job_logs) shows no trace of a record, not even a blank line.
    return _START + json.dumps(body, separators=(",", ":")) + _END


def _decode(text: str) -> tuple[JobRecord, bool] | None:
    """The record in `text` and whether it is final; None for anything that is not a well-formed record."""
    try:
        body = json.loads(text)
        attempts = tuple(
            JobAttempt(
                number=int(a["number"]),
                status=JobStatus(a["status"]),
                exit_code=a.get("exit_code"),
                start_time=a.get("start_time"),
                end_time=a.get("end_time"),
                message=str(a.get("message", "")),
                outcome=str(a.get("outcome", "")),
                grace=None if a.get("grace") is None else float(a["grace"]),
                world_size=None if a.get("world_size") is None else int(a["world_size"]),
            )
            for a in body["attempts"]
        )
        result: Any = None
        if "result" in body:
            result = load_plain(base64.b64decode(body["result"]))
        result_repr = str(body["result_repr"]) if "result_repr" in body else None
        error = None
        if body.get("error"):
            e = body["error"]
            error = JobError(str(e["type"]), str(e["message"]), str(e.get("traceback", "")), int(e.get("rank", 0)))
        record = JobRecord(int(body["replicas"]), attempts, result, result_repr, error)
        return record, body.get("final") is True
    except Exception:  # RecursionError, OverflowError, MemoryError too: a job may print anything, and it is ignored
        return None


def last_record(log_tail: str) -> JobRecord | None:
    """The first final record in this piece of a job's raw log (before plain-text cleaning), else the last
    well-formed one, if any."""
    last = None
    for match in _RECORD.finditer(log_tail):
        decoded = _decode(match.group(1))
        if decoded is None:
            continue
        if decoded[1]:
            return decoded[0]
        last = decoded[0]
    return last


def final_record(log_tail: str) -> JobRecord | None:
    """The first final record in this piece of a job's raw log, if any: its supervisor had ended the job."""
    for match in _RECORD.finditer(log_tail):
        decoded = _decode(match.group(1))
        if decoded is not None and decoded[1]:
            return decoded[0]
    return None
