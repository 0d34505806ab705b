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

from fray.jobs.call import CALL_VAR, RESULT_FD_VAR
from fray.jobs.records import dump_plain, short_repr


def _run(fd: int) -> int:
    fn, args, kwargs = pickle.loads(base64.b64decode(os.environ.pop(CALL_VAR)))
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
    fd = int(os.environ.pop(RESULT_FD_VAR))
    os.set_inheritable(fd, False)  # the callable's own subprocesses must not hold the supervisor's pipe open
    sys.stdout.flush()
    return _run(fd)


if __name__ == "__main__":
    sys.exit(main())
