"""Where a context publishes the jobs it holds waiting (fray.jobs.dependencies), for the other processes of its user on
its host that talk to the same cluster: their `list_jobs` (`fray job list`), `get_job`, `wait_job` and `stop_job` see
such a job while the context that holds it lives.

A cluster's board is a private directory in the state directory (`job-waits/<backend>-<hash of where the cluster
is>`); a job is one file in it (0600), written by its holder whenever the job's record changes and removed once the
job started, was deleted, or its holder shut down. A file whose holder no longer runs (its pid, start time and boot
no longer match: fray.host.procfs.Identity) is stale: readers remove it. Another process asks the holder to stop a job
with a second file beside it, which the holder's watcher reads each round.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

from fray.errors import FrayError
from fray.host.procfs import Identity
from fray.host.state_dir import read_json, state_subdir, write_json
from fray.types import JobInfo, JobStatus

__all__ = ["Board"]

_RECORD = ".json"
_STOP = ".stop"


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


class Board:
    """One context's view of its cluster's board: what it publishes, and what the other holders published."""

    def __init__(self, backend: str, where: dict[str, str]) -> None:
        self._name = f"{backend}-{_digest(json.dumps([backend, where], sort_keys=True), 16)}"
        self._token = uuid.uuid4().hex  # this holder (several contexts of one process each hold their own)
        owner = Identity.of(os.getpid())
        self._owner = owner.record() if owner is not None else None

    def _dir(self) -> Path:
        return state_subdir("job-waits", self._name)

    def _file(self, job_id: str, suffix: str) -> Path:
        return self._dir() / f"{_digest(job_id, 32)}{suffix}"

    # ------------------------------------------------------------------ the holder
    def publish(self, info: JobInfo) -> None:
        """Publish (or update) a held job's record; a board that cannot be written leaves the job as it is."""
        if self._owner is None:
            return
        body = {
            "token": self._token,
            "owner": self._owner,
            "info": {
                "id": info.id,
                "status": info.status.value,
                "submission_time": info.submission_time,
                "end_time": info.end_time,
                "entrypoint": info.entrypoint,
                "message": info.message,
                "name": info.name,
                "waiting_for": list(info.waiting_for),
            },
        }
        try:
            write_json(self._file(info.id, _RECORD), body)
        except (OSError, FrayError):
            return

    def withdraw(self, job_id: str) -> None:
        for suffix in (_RECORD, _STOP):
            try:
                os.unlink(self._file(job_id, suffix))
            except (OSError, FrayError):
                continue

    def stop_asked(self, job_id: str) -> bool:
        """Whether another process asked to stop this held job (the request is consumed)."""
        try:
            os.unlink(self._file(job_id, _STOP))
        except (OSError, FrayError):
            return False
        return True

    # ------------------------------------------------------------------ the others
    def others(self) -> list[JobInfo]:
        """The jobs the other live holders of this cluster published."""
        try:
            names = [entry.name for entry in os.scandir(self._dir()) if entry.name.endswith(_RECORD)]
        except (OSError, FrayError):
            return []
        found = (self._read(self._dir() / name) for name in names)
        return [held[0] for held in found if held is not None]

    def other(self, job_id: str) -> tuple[JobInfo, int] | None:
        """A job another live holder published, and that holder's pid; None if none did."""
        try:
            return self._read(self._file(job_id, _RECORD))
        except (OSError, FrayError):
            return None

    def ask_stop(self, job_id: str) -> None:
        write_json(self._file(job_id, _STOP), {"by": os.getpid()})

    def _read(self, path: Path) -> tuple[JobInfo, int] | None:
        try:
            body = read_json(path)
        except FrayError:  # another user's file in our directory: not trusted
            return None
        if body is None or body.get("token") == self._token:
            return None
        owner = Identity.from_record(body.get("owner"))
        if owner is None or not owner.running():
            try:
                os.unlink(path)  # its holder ended (however it ended): the wait went with it
            except OSError:
                pass
            return None
        try:
            return _decode(body["info"]), owner.pid
        except (KeyError, TypeError, ValueError):
            return None


def _decode(data: dict[str, Any]) -> JobInfo:
    return JobInfo(
        str(data["id"]),
        JobStatus(data["status"]),
        submission_time=None if data["submission_time"] is None else float(data["submission_time"]),
        end_time=None if data["end_time"] is None else float(data["end_time"]),
        entrypoint=str(data["entrypoint"]),
        message=str(data["message"]),
        name=None if data["name"] is None else str(data["name"]),
        waiting_for=tuple(str(job) for job in data["waiting_for"]),
    )
