"""Fray's state directory: what outlives one process or one `fray` command.

    $FRAY_STATE_DIR, else $XDG_STATE_HOME/fray, else ~/.local/state/fray
        jobs/<job id>/        a detached local job (see fray.detached): job.json, state.json, log
        clusters/<name>.json  a cluster `fray cluster start` started (address, process group, temp dir)

The directory is read at each use, so a change of FRAY_STATE_DIR takes effect at once. Files are written whole
(to a temporary name, then renamed), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_VAR",
    "forget_cluster",
    "group_members",
    "process_start",
    "read_cluster",
    "read_json",
    "record_cluster",
    "same_process",
    "state_dir",
    "stop_group",
    "write_json",
]

ENV_VAR = "FRAY_STATE_DIR"


def state_dir() -> Path:
    """Where fray keeps what outlives one process (not created here)."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit).expanduser().absolute()
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base).absolute() / "fray"


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` whole (readers see the old file or the new one), readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None if there is none (missing or unreadable)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()  # fields from the state on (the name may hold spaces)


def process_start(pid: int) -> str | None:
    """An identity for the live process `pid` (its start time in clock ticks), None if none runs (or a zombie).

    Stored next to a pid so that a later reader does not take another process that got the same number for it.
    Where there is no /proc, only whether the pid exists ("?")."""
    if not os.path.isdir("/proc/self"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return fields[19]  # field 22 of /proc/PID/stat: starttime


def same_process(pid: int | None, start: str | None) -> bool:
    """True if the process recorded as (pid, start) is still running."""
    if not pid:
        return False
    now = process_start(int(pid))
    return now is not None and (start is None or now == start or "?" in (now, start))


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group pgid."""
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def stop_group(pgid: int, grace: float = 3.0) -> bool:
    """SIGTERM process group pgid, SIGKILL what is left after `grace` seconds; True once none of it runs."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            return True
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            return not group_members(pgid)
        deadline = time.monotonic() + grace
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    return not group_members(pgid)


def _cluster_file(backend: str) -> Path:
    return state_dir() / "clusters" / f"{backend}.json"


def record_cluster(backend: str, record: dict[str, Any]) -> Path:
    """Remember the cluster `fray cluster start` started for `backend`."""
    path = _cluster_file(backend)
    write_json(path, record)
    return path


def read_cluster(backend: str) -> dict[str, Any] | None:
    """The recorded cluster of `backend`, or None."""
    return read_json(_cluster_file(backend))


def forget_cluster(backend: str) -> None:
    try:
        _cluster_file(backend).unlink()
    except FileNotFoundError:
        pass
