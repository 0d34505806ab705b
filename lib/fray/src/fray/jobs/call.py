"""A job whose entrypoint is a Python callable: how the call travels to its ranks (FRAY_JOB_CALL, made by
ClusterContext.create_job) and how each rank tells fray.jobs.supervisor how it went (CallOutcome, through the pipe
FRAY_JOB_RESULT_FD names). The rank itself is fray.jobs.run_call.

Where a backend's job record shows a job's environment to others (a Ray cluster's dashboard and Job API), a
cluster fray started keeps the call out of it: `stash_call` moves it into a private file (0600, in a 0700
directory of the user's state) named by FRAY_JOB_CALL_FILE, and the supervisor takes it back (`take_stashed_call`)
and removes the file before anything else."""

from __future__ import annotations

import base64
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from fray.host import settings
from fray.jobs.records import load_plain
from fray.types import JobError

__all__ = [
    "CALL_FILE_VAR",
    "CALL_VAR",
    "RESULT_FD_VAR",
    "CallOutcome",
    "encode_call",
    "read_outcome",
    "stash_call",
    "take_stashed_call",
]

CALL_VAR = settings.JOB_CALL.name  # base64 of the pickled (fn, args, kwargs)
RESULT_FD_VAR = settings.JOB_RESULT_FD.name
CALL_FILE_VAR = settings.JOB_CALL_FILE.name  # a private file holding the call, where the environment is shown
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


def stash_call(env_vars: dict[str, str], directory: Path) -> None:
    """Moves FRAY_JOB_CALL out of `env_vars` into a new private file in `directory` (a private directory of the
    user's, on the machine where the job runs), named by FRAY_JOB_CALL_FILE instead."""
    call = env_vars.pop(CALL_VAR, None)
    if call is None:
        return
    path = directory / f"call-{secrets.token_hex(8)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(call)
    env_vars[CALL_FILE_VAR] = str(path)


def take_stashed_call() -> None:
    """In the job's supervisor: FRAY_JOB_CALL from the file FRAY_JOB_CALL_FILE names (a regular file of this
    user's, not a link), which is then removed. Nothing if FRAY_JOB_CALL is set or no file is named."""
    name = settings.JOB_CALL_FILE.take()
    if name is None or CALL_VAR in os.environ:
        return
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > CALL_MAX:
            raise ValueError(f"{name} is not a job call of this user's (a regular file of theirs): not read")
        with os.fdopen(os.dup(fd), "r") as f:
            os.environ[CALL_VAR] = f.read(CALL_MAX + 1)
    finally:
        os.close(fd)
    os.unlink(name)


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
