"""Fray's state directory: what outlives one process or one `fray` command.

    $FRAY_STATE_DIR, else $XDG_STATE_HOME/fray, else ~/.local/state/fray
        jobs/<job id>/        a detached local job (see fray.jobs.detached): job.json, state.json, log
        clusters/<name>.json  a cluster `fray cluster start` started (address, its leader's identity, temp dir)

The directory is read at each use, so a change of FRAY_STATE_DIR takes effect at once. Files are written whole
(to a temporary name, then renamed), so a reader never sees half of one. Processes are recorded as
fray.host.procfs.Identity (pid, start time, boot): nothing recorded here is signalled without that proof.

What is recorded here decides which processes fray signals, so nobody else may write it: the state directory and
every directory fray uses in it are checked with `lstat` at each use (`private_dir`: a directory, not a symlink,
owned by this user; mode 0700, set if it was looser) and one that is not is refused with FrayError, never read;
files are opened with O_NOFOLLOW and must be this user's (`read_json`). A state directory that another user made
first (a FRAY_STATE_DIR under /tmp, say) is refused, not used.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from fray.errors import FrayError
from fray.host import settings

__all__ = [
    "ENV_VAR",
    "forget_cluster",
    "private_dir",
    "read_cluster",
    "read_json",
    "record_cluster",
    "state_dir",
    "state_subdir",
    "write_json",
]

ENV_VAR = settings.STATE_DIR.name


def state_dir() -> Path:
    """Where fray keeps what outlives one process (not created here)."""
    explicit = settings.STATE_DIR.read()
    if explicit is not None:
        return explicit.absolute()
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base).absolute() / "fray"


def private_dir(path: Path, create: bool = True) -> Path:
    """`path` as a directory only this user can use: mode 0700, owned by this user, not a symlink (made, with
    missing parents, if `create`; else FileNotFoundError if it is missing). What is in it (a job's log, state that
    decides what fray signals) is nobody else's to read or replace, even in a shared temp directory. FrayError if it
    exists and is not ours; a looser mode of ours is made 0700."""
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise FrayError(
            f"{path} is not a directory of this user's (a symlink, or someone else's): not used. Remove it if it is "
            "yours to remove, or point fray elsewhere (FRAY_STATE_DIR for the state directory)"
        )
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def state_subdir(*parts: str, create: bool = True) -> Path:
    """A directory in the state directory (the state directory itself without `parts`), each level checked with
    private_dir: what is recorded below a directory of someone else's is never trusted."""
    path = private_dir(state_dir(), create)
    for part in parts:
        path = private_dir(path / part, create)
    return path


def write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` whole (readers see the old file or the new one), readable by the owner only.
    Its directory must be a private one of this user's (private_dir)."""
    private_dir(path.parent)
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
    """The JSON object in `path`, or None if there is none (missing or unreadable). Read without following a
    symlink, and only if the file is this user's (FrayError otherwise: someone else wrote it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_uid != os.getuid():
            raise FrayError(f"{path} belongs to another user (uid {info.st_uid}): not read. Remove it")
        try:
            data = json.load(f)
        except (OSError, ValueError):
            return None
    return data if isinstance(data, dict) else None


def _cluster_file(backend: str, create: bool = True) -> Path:
    return state_subdir("clusters", create=create) / f"{backend}.json"


def record_cluster(backend: str, record: dict[str, Any]) -> Path:
    """Remember the cluster `fray cluster start` started for `backend`."""
    path = _cluster_file(backend)
    write_json(path, record)
    return path


def read_cluster(backend: str) -> dict[str, Any] | None:
    """The recorded cluster of `backend`, or None."""
    try:
        return read_json(_cluster_file(backend, create=False))
    except FileNotFoundError:  # no state directory yet: nothing recorded
        return None


def forget_cluster(backend: str) -> None:
    try:
        _cluster_file(backend, create=False).unlink()
    except FileNotFoundError:
        pass
