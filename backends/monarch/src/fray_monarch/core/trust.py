"""Whether a path's contents are this user's alone to change: what fray loads code from (the socket guard's
library, a worker's import path) must be.

A path is trusted when every directory on the way to it, symbolic links followed one by one (so the link and the
directory holding it are checked as well as where it leads), and the path itself are owned by this user or root,
and none can be written by anyone else: not by its group, not by every user. A directory that others may write
but whose sticky bit is set (/tmp) is passed through, as long as the next step is this user's or root's: there
others cannot rename or replace what is not theirs. The path itself never may be writable by others.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fray.backend import private_dir
from fray.errors import FrayError

__all__ = ["fray_home", "untrusted_reason"]

_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def untrusted_reason(path: str | os.PathLike[str]) -> str | None:
    """Why `path` is not this user's alone to change (None: it is). FileNotFoundError if it does not exist."""
    me = os.geteuid()
    todo = list(Path(os.path.abspath(path)).parts[1:])
    current = "/"
    info = os.lstat(current)
    links = 0
    while True:
        if info.st_uid not in (me, 0):
            return f"{current} belongs to another user (uid {info.st_uid})"
        if not todo:
            break
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current) or "/"
            info = os.lstat(current)
            continue
        shared = stat.S_IMODE(info.st_mode) & _OTHERS_WRITE
        if shared and not info.st_mode & stat.S_ISVTX:
            return f"others can write to {current} (mode {stat.S_IMODE(info.st_mode):o}), which holds it"
        step = os.path.join(current, name)
        info = os.lstat(step)
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in (me, 0):
                return f"{step} is a link of another user's (uid {info.st_uid})"
            links += 1
            if links > _MAX_LINKS:
                return f"too many symbolic links on the way to {path}"
            target = os.readlink(step)
            todo[:0] = [p for p in Path(target).parts if p != "/"]
            if os.path.isabs(target):
                current = "/"
            info = os.lstat(current)
            continue
        current = step
    if stat.S_IMODE(info.st_mode) & _OTHERS_WRITE:
        return f"others can write to {current} (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def fray_home() -> Path:
    """~/.fray, this user's private directory (0700, whatever the umask; FrayError if it is not this user's)."""
    try:
        return private_dir(Path.home() / ".fray")
    except OSError as exc:
        raise FrayError(f"fray cannot keep its files in {Path.home() / '.fray'} ({exc}): make HOME yours") from None
