"""One rank of a job whose entrypoint is a Python callable: `python -m fray.jobs.run_call`, started by
fray.jobs.supervisor. Runs `fn(*args, **kwargs)` from FRAY_JOB_CALL and writes a CallOutcome (fray.jobs.call) to the
pipe FRAY_JOB_RESULT_FD names: the return value where it is plain data (fray.jobs.records), else its repr; or the
exception's type, message and traceback (also printed to stderr, so the log has it). Exits 0, or 1 after an
exception (sys.exit in the callable exits as it asks). Not imported by fray itself: `-m` runs it fresh.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import traceback
from typing import Any

from fray.host import settings
from fray.jobs.call import CALL_VAR, RESULT_FD_VAR
from fray.jobs.records import dump_plain, short_repr


def _run(fd: int) -> int:
    call = settings.JOB_CALL.take()
    if call is None:
        raise SystemExit(f"fray.jobs.run_call runs the call in ${CALL_VAR}, which is not set (the supervisor sets it)")
    fn, args, kwargs = pickle.loads(base64.b64decode(call))
    rank = int(os.environ.get("RANK", "0"))
    body: dict[str, Any]
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        text = traceback.format_exc()
        sys.stderr.write(text)
        sys.stderr.flush()
        body = {"ok": False, "type": type(exc).__name__, "message": str(exc), "traceback": text, "rank": rank}
        code = 1
    else:
        data = dump_plain(value)
        body = {"ok": True, "result": base64.b64encode(data).decode() if data is not None else None}
        if data is None and value is not None:
            body["repr"] = short_repr(value)
        code = 0
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(json.dumps(body).encode())
    return code


def main() -> int:
    fd = settings.JOB_RESULT_FD.take()
    if fd is None:
        raise SystemExit(f"fray.jobs.run_call writes to the pipe ${RESULT_FD_VAR} names, which is not set")
    os.set_inheritable(fd, False)  # the callable's own subprocesses must not hold the supervisor's pipe open
    sys.stdout.flush()
    return _run(fd)


if __name__ == "__main__":
    sys.exit(main())
