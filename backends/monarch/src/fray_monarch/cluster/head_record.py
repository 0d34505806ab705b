"""The recorded monarch cluster (`fray cluster start --backend monarch`): its record in the state directory and
the client side of its head's socket (head.py is the server). JSON both ways: nothing is unpickled."""

from __future__ import annotations

import json
import os
from typing import Any

from fray.backend import Identity, JobInfo, JobStatus, state_dir
from fray.errors import FrayError, GetTimeoutError, InfeasibleResourcesError, JobExistsError, JobNotFoundError

__all__ = ["NAME", "REQUEST_TIMEOUT", "decode_info", "encode_info", "recorded", "request"]

NAME = "monarch"  # the record's name in the state directory
REQUEST_TIMEOUT = 60.0  # seconds an answer may take (a wait asks for its own timeout more)
ERRORS: dict[str, type[Exception]] = {
    "JobNotFoundError": JobNotFoundError,
    "JobExistsError": JobExistsError,
    "InfeasibleResourcesError": InfeasibleResourcesError,
    "GetTimeoutError": GetTimeoutError,
    "ValueError": ValueError,
    "TypeError": TypeError,
}


# What a head sends of a JobInfo: what its backend knows. The client's ClusterContext adds the rest (name,
# attempts, result: from the job's id and its log's record), as for any backend.
_SENT = ("id", "submission_time", "start_time", "end_time", "entrypoint", "exit_code", "message")


def encode_info(info: JobInfo) -> dict[str, Any]:
    return {**{key: getattr(info, key) for key in _SENT}, "status": info.status.value}


def decode_info(data: dict[str, Any]) -> JobInfo:
    return JobInfo(**{**data, "status": JobStatus(data["status"])})


def recorded() -> dict[str, Any] | None:
    """The head `fray cluster start` recorded, with "running": whether its process still runs (proven by its
    pid, start time and boot: fray.host.procfs.Identity)."""
    record = state_dir.read_cluster(NAME)
    if record is None:
        return None
    leader = Identity.from_record(record.get("leader"))
    return {**record, "running": leader is not None and leader.running()}


def _private_socket_dir(path: str) -> None:
    """Refuse a socket whose directory another user could have made or could replace."""
    info = os.lstat(os.path.dirname(path))
    if info.st_uid != os.getuid() or info.st_mode & 0o077 or not os.path.isdir(os.path.dirname(path)):
        raise FrayError(f"the monarch head's socket directory {os.path.dirname(path)} is not private to this user")


def request(socket_path: str, message: dict[str, Any], timeout: float | None = REQUEST_TIMEOUT) -> Any:
    """Send one request to the head and return its answer, or raise the error it answered with."""
    import socket

    _private_socket_dir(socket_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except OSError as exc:
            raise FrayError(f"the monarch cluster's head does not answer at {socket_path}: {exc}") from None
        sock.sendall(json.dumps(message).encode() + b"\n")
        with sock.makefile("rb") as answer:
            line = answer.readline()
    if not line:
        raise FrayError("the monarch cluster's head closed the connection without answering")
    reply = json.loads(line)
    if "error" in reply:
        raise ERRORS.get(reply["error"], FrayError)(reply["message"])
    return reply.get("value")
