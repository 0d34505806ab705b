"""The private temp directories of a monarch driver: one per process (where its Monarch runtime makes its socket
directory), one per context in it (the TMPDIR of the processes that context spawns on this host)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from fray.backend import watchdog
from fray_monarch.core import runtime
from fray_monarch.data.arena import proc_tag

# Monarch's processes make their unix-socket directories (Rust tempfile: "$TMPDIR/.tmpXXXXXX") under TMPDIR and
# remove them only when they exit cleanly: a killed process (a driver's SIGKILL, SIGTERM or SIGINT; the SIGKILL
# Monarch sends its children when the driver exits) leaves them behind. So fray points TMPDIR at directories of its
# own: one per process, where this process's Monarch runtime makes its socket directory, and one per context in
# it, the TMPDIR of the processes that context spawns on this host. A context removes its directory at shutdown;
# the process's directory stays for the life of the process, and fray's watchdog removes it when the process
# ends, however it ends.

PRIVATE_PREFIX = "fray-m"  # + 8 random characters (mkdtemp): short, because sockets are made in there
OWNER_FILE = "owner"  # in a private directory: "<pid>-<start time>" of the process it belongs to
# A unix socket path has at most 107 bytes. Monarch's children bind "<its socket dir>/<11 characters>", the
# socket dir being "<TMPDIR>/.tmpXXXXXX": the private directory ("/fray-mXXXXXXXX", 15) adds to that.
_SOCKET_PATH_MAX = 107
_MONARCH_SOCKET_TAIL = len("/.tmpXXXXXX/") + 11

_private: tuple[int, str, str] | None = None  # (pid, private directory, the user's temp directory)
_private_lock = threading.Lock()


def private_dir() -> str:
    """This process's private temp directory, made the first time (and Monarch's runtime of this process started
    with TMPDIR pointing into it): `<TMPDIR>/fray-mXXXXXXXX`, or `/tmp/fray-mXXXXXXXX` if TMPDIR is too long for
    Monarch's socket paths below it. It stays for the life of the process, also once every context is shut down:
    Monarch's runtime in this process lives on (0.7 cannot stop it) with its socket directory in there, which
    Monarch used directly after fray still needs; and a directory removed while the process lives
    leaves its name, which others can list in the temp directory, free for another user to make again. Removed
    by fray's watchdog when this process ends; one left by a process whose watchdog did not run is removed by the
    next start."""
    global _private
    with _private_lock:
        if _private is not None and _private[0] == os.getpid():
            return _private[1]
        user = tempfile.gettempdir()  # also fixes tempfile's own choice before TMPDIR changes for a moment below
        base = user
        if len(base) + 1 + len(PRIVATE_PREFIX) + 8 + _MONARCH_SOCKET_TAIL > _SOCKET_PATH_MAX:
            base = "/tmp"
        reclaim_private_dirs(base)
        path = tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=base)
        with open(os.path.join(path, OWNER_FILE), "w") as f:
            f.write(proc_tag(os.getpid()) or "")
        watchdog.watch_path(path)
        runtime.start_monarch_in(path)
        _private = (os.getpid(), path, user)
        return path


def user_tmpdir() -> str:
    """This process's temp directory as its user set it (TMPDIR, else tempfile's choice): the jobs' TMPDIR."""
    private_dir()
    assert _private is not None
    return _private[2]


def reclaim_private_dirs(base: str) -> int:
    """Remove the private directories in `base` of processes that are gone. Returns how many were removed.

    `base` is shared with other users (/tmp): only a real directory of this user's (no symlink, mode 0700) is
    looked into, and its owner file is read only if it is a regular file of this user's, opened without following
    a link or blocking (a FIFO or a link to /dev/zero planted by another user once hung or exhausted every
    monarch driver's start)."""
    removed = 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(PRIVATE_PREFIX) or len(name) != len(PRIVATE_PREFIX) + 8:
            continue
        path = os.path.join(base, name)
        tag = _owner_tag(path)
        if tag is None:
            continue  # not one of ours, or being made right now
        pid = tag.split("-", 1)[0]
        if not pid.isdigit() or proc_tag(int(pid)) == tag:
            continue  # its process is alive
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


_TAG_MAX = 256  # an owner file holds "<pid>-<start time>-<pid namespace>": far less


def _owner_tag(path: str) -> str | None:
    """The owner tag of the private directory `path` if it is one of this user's, else None."""
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            return None
        fd = os.open(OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return None
            return os.read(fd, _TAG_MAX).decode(errors="replace").strip()
        finally:
            os.close(fd)
    except OSError:
        return None
    finally:
        os.close(dir_fd)


def context_dir() -> str:
    """A new directory in this process's private directory: the TMPDIR of one context's local processes."""
    return tempfile.mkdtemp(prefix="c", dir=private_dir())


def bootstrap_command(tmpdir: str, env: Mapping[str, str] | None = None) -> Any:
    """Monarch's bootstrap command for a process on this host whose TMPDIR is `tmpdir`, started with `env` too."""
    return runtime.default_bootstrap_cmd().with_env({**(env or {}), "TMPDIR": tmpdir})
