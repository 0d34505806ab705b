"""Monarch's own log file, made safe before Monarch is imported.

Monarch 0.7 writes its log to `/tmp/<user>/monarch_log.log` (`<user>`: this process's user's name; with
MONARCH_LOG_SUFFIX, `monarch_log_<suffix>.log`), whatever TMPDIR says: it creates `/tmp/<user>` with the umask
if it is missing and opens the file by name, following a symbolic link and blocking on a FIFO. It has no setting
for that directory. Another user who made `/tmp/<user>` first could read the log, hang every Monarch import of
this user (a FIFO) or make it append to any file this user can write (a link). So fray makes the directory
itself, private (0700), before Monarch is imported, or checks the one there: it must be a real directory of this
user's (made 0700 if it is not yet), and a log file in it a regular file of this user's (made 0600). Anything
else is refused, with an error naming the path and what to do, and Monarch is not started.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from fray.errors import FrayError

__all__ = ["claim_monarch_log_dir", "monarch_log_path"]

LOG_ROOT = Path("/tmp")  # Monarch's own choice, not the temp directory


def monarch_log_path() -> Path:
    """Where Monarch 0.7 will write this process's log."""
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = ""
    suffix = os.environ.get("MONARCH_LOG_SUFFIX")
    return LOG_ROOT / (user or "monarch") / (f"monarch_log_{suffix}.log" if suffix else "monarch_log.log")


def claim_monarch_log_dir() -> Path:
    """Makes (or checks) the directory of Monarch's log as this user's private directory; FrayError naming the
    path if someone else's directory, a link or another kind of file is in the way. Returns the log's path."""
    log = monarch_log_path()
    directory = log.parent
    me = os.geteuid()
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != me:
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
        if stat.S_ISDIR(info.st_mode):
            what = f"a directory of uid {info.st_uid}, not yours"
        raise FrayError(
            f"Monarch 0.7 writes its log into {directory}, which is {what}: whoever made it could read that log, "
            f"make every Monarch start of yours hang, or make it write into another of your files. fray does not "
            f"start Monarch with it in the way: have it removed (by its owner or root: `rm -r {directory}`), then "
            f"start again (fray then makes it, private to you)."
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(directory, 0o700)  # ours, made by Monarch with the umask: others may read no log of ours
    try:
        entry = os.lstat(log)
    except FileNotFoundError:
        return log
    if not stat.S_ISREG(entry.st_mode) or entry.st_uid != me or entry.st_nlink != 1:
        raise FrayError(
            f"Monarch 0.7 writes its log to {log}, which is not a regular file of yours (planted while "
            f"{directory} was open to others?): Monarch would block on it or write through it. Remove it "
            f"(`rm {log}`) and start again."
        )
    if stat.S_IMODE(entry.st_mode) & 0o077:
        os.chmod(log, 0o600)
    return log
