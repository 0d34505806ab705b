"""Fray's state directory: what outlives one process or one `fray` command.

    $FRAY_STATE_DIR, else $XDG_STATE_HOME/fray, else ~/.local/state/fray
        jobs/<job id>/        a detached local job (see fray.detached): job.json, state.json, log
        clusters/<name>.json  a cluster `fray cluster start` started (address, its leader's identity, temp dir)

The directory is read at each use, so a change of FRAY_STATE_DIR takes effect at once. Files are written whole
(to a temporary name, then renamed), so a reader never sees half of one. Processes are recorded as
fray.procfs.Identity (pid, start time, boot): nothing recorded here is signalled without that proof.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["ENV_VAR", "forget_cluster", "read_cluster", "read_json", "record_cluster", "state_dir", "write_json"]

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
