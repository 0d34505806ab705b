"""A job whose entrypoint is a Python callable: how the call travels to its ranks (FRAY_JOB_CALL, made by
ClusterContext.create_job) and how each rank tells fray.job_supervisor how it went (CallOutcome, through the pipe
FRAY_JOB_RESULT_FD names). The rank itself is fray.run_job_call."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass

from fray.job_records import load_plain
from fray.types import JobError

__all__ = ["CALL_VAR", "RESULT_FD_VAR", "CallOutcome", "encode_call", "read_outcome"]

CALL_VAR = "FRAY_JOB_CALL"  # base64 of the pickled (fn, args, kwargs)
RESULT_FD_VAR = "FRAY_JOB_RESULT_FD"
CALL_MAX = 96 * 1024  # characters of FRAY_JOB_CALL: an environment variable holds at most 128 KiB on Linux
OUTCOME_MAX = 1 << 20


@dataclass(frozen=True)
class CallOutcome:
    result: bytes | None = None  # dump_plain of the return value
    result_repr: str | None = None  # the return value's repr, where it is not plain data
    error: JobError | None = None


def encode_call(payload: bytes) -> str:
    """FRAY_JOB_CALL's value for a pickled (fn, args, kwargs); ValueError when too big for the environment."""
    text = base64.b64encode(payload).decode()
    if len(text) > CALL_MAX:
        raise ValueError(
            f"the callable and its arguments pickle to {len(payload) // 1024} KiB; a job's call travels in its "
            f"environment, which holds at most {CALL_MAX * 3 // 4 // 1024} KiB of it. Pass big data by path (a "
            "file the job reads) or by reference (a module-level function and small arguments)"
        )
    return text


def read_outcome(fd: int) -> CallOutcome:
    """What a rank wrote to its end of the pipe (read to its end); no outcome if it wrote none (it was killed)."""
    chunks = []
    size = 0
    with os.fdopen(fd, "rb") as pipe:
        while chunk := pipe.read(65536):
            size += len(chunk)
            if size <= OUTCOME_MAX:
                chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except ValueError:
        return CallOutcome()
    if body.get("ok"):
        data = base64.b64decode(body["result"]) if body.get("result") is not None else None
        if data is not None:
            load_plain(data)  # only plain data goes on the record
        return CallOutcome(data, body.get("repr"))
    error = JobError(str(body["type"]), str(body["message"]), str(body.get("traceback", "")), int(body["rank"]))
    return CallOutcome(error=error)
