"""fray's socket guard (socket_guard.c): Unix-socket connections from other users never reach Monarch.

Monarch 0.7 serves each process's mailbox (and its host's) on abstract Unix sockets, which Linux does not
protect by permissions and lists to every user in /proc/net/unix; a message sent there can run code as the
process's user. Monarch has no setting for it. The guard, a small library preloaded into the process
(LD_PRELOAD), makes accept() close every Unix-socket connection whose peer is another user before Monarch sees
it. A library can only be preloaded when a process starts, so:

- processes fray starts (Monarch's worker processes, host workers, the cluster head, jobs) inherit it from a
  guarded parent, and a host worker started by hand restarts itself under it;
- a driver (your Python process) must start under it: `fray run`, `python -m fray_monarch.socket_guard CMD...`,
  or `LD_PRELOAD=$(python -m fray_monarch.socket_guard)`. A monarch context in a driver without it is refused
  unless the spec says `unguarded_sockets=true` (on a machine no one else uses).

The library is built when fray-monarch is installed (setup.py: fray_monarch/_socket_guard*.so, with the hash of
its source beside it). Where that build is missing or was made from another source, it is built once per user
from its C source with the machine's C compiler (`cc`, or $CC) into ~/.fray/lib (~/.fray and it 0700, whatever
the umask), named by the machine's architecture and the hash of the source. Either is checked each time it is
used, and in a process that preloaded it (`active`): a regular file of this user's or root's that no one else can
write, every directory on the way to it this user's or root's and writable by no one else
(fray_monarch.core.trust), so no member of a shared group can swap the library every process of this user
preloads. A process started again under the guard that still runs without it (the loader could not preload it)
fails at once, saying why, instead of starting again.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from fray.backend import private_dir, settings
from fray.errors import FrayError
from fray_monarch.core.trust import fray_home, untrusted_reason

__all__ = [
    "active",
    "guarded_environ",
    "library",
    "require",
    "restart_guarded",
    "restart_under_guard",
    "warn_unguarded",
]

SOURCE = Path(__file__).with_name("socket_guard.c")
MARKER = "fray_socket_guard_version"  # a symbol of the library: found in a process that preloaded it
OPT_OUT = "unguarded_sockets"  # the spec option that accepts a driver without the guard
BUILD_TIMEOUT = 60.0
RESTARTED = settings.SOCKET_GUARD_RESTARTED.name  # set in a process started again under the guard: never twice


def _lib_dir() -> Path:
    return Path.home() / ".fray" / "lib"


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _loaded() -> Path | None:
    """The file of the guard this process preloaded (the library its marker comes from), if any."""
    try:
        process = ctypes.CDLL(None)
        marker = getattr(process, MARKER)
    except (OSError, AttributeError):
        return None
    info = _DlInfo()
    if not process.dladdr(ctypes.cast(marker, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return Path(os.fsdecode(info.dli_fname))


def _distrust(path: Path) -> str | None:
    """Why `path` is not a guard library this user can trust (None: it is); FileNotFoundError if missing."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode) or info.st_uid not in (os.getuid(), 0) or info.st_mode & 0o022:
        return f"{path} is not a regular file of this user's (or root's) that only its owner can write"
    return untrusted_reason(path)


def _installed(source_hash: str) -> Path | None:
    """The guard built when fray-monarch was installed, if it was built from this source and can be trusted."""
    here = Path(__file__).parent
    try:
        if (here / "_socket_guard.sha256").read_text().strip() != source_hash:
            return None  # (an editable install whose source changed since: the per-user build it is)
    except OSError:
        return None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_socket_guard{suffix}"
        try:
            if _distrust(path) is None:
                return path
        except OSError:
            continue
    return None


def _preloadable(path: Path) -> Path:
    """`path`, unless LD_PRELOAD cannot name it (it splits its list at spaces and colons): FrayError then."""
    if " " in str(path) or ":" in str(path):
        raise FrayError(
            f"fray's socket guard {path} cannot be preloaded: LD_PRELOAD splits paths at spaces and colons. Install "
            "fray-monarch, or set HOME, in a path without them"
        )
    return path


def active() -> bool:
    """Whether this process runs with the guard preloaded, from a library this user can trust (see `_distrust`):
    a look-alike from anywhere else does not count."""
    loaded = _loaded()
    if loaded is None:
        return False
    try:
        return _distrust(loaded) is None
    except OSError:
        return False


def _checked(path: Path) -> bool:
    """True if `path` is a library this user built and can trust, False if it is missing; FrayError naming what
    is wrong otherwise."""
    try:
        why = _distrust(path)
    except FileNotFoundError:
        return False
    if why is not None:
        raise FrayError(
            f"fray's socket guard {path} is not to be trusted: {why}. Someone else may have replaced it: remove "
            "it, make each directory on the way yours and writable by you only (chmod go-w), and start again"
        )
    return True


def library() -> Path:
    """The guard library's path: the one installed with fray-monarch, else this user's, built here first if this
    user has none of this source for this machine's architecture yet (a home shared by machines of two kinds)."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()
    installed = _installed(digest)
    if installed is not None:
        return _preloadable(installed)
    lib_dir = _lib_dir()
    path = _preloadable(lib_dir / f"socket-guard-{platform.machine()}-{digest[:16]}.so")
    try:
        fray_home()
        private_dir(lib_dir)
        if _checked(path):
            return path
    except OSError as exc:
        raise FrayError(
            f"fray's socket guard cannot be kept in {lib_dir} ({exc}): make HOME a directory of yours"
        ) from None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise FrayError(
            "fray's socket guard (which keeps other users of this machine out of Monarch's sockets) is built once "
            "with a C compiler, and this machine has none on PATH: install one (e.g. apt-get install gcc) or set "
            f"CC; or, on a machine no one else uses, add {OPT_OUT}=true to the monarch spec"
        )
    fd, scratch = tempfile.mkstemp(dir=lib_dir, suffix=".so")  # same directory: the rename below is atomic
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", scratch, str(SOURCE), "-ldl"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
        if done.returncode != 0:
            raise FrayError(f"building fray's socket guard with {compiler} failed:\n{done.stderr.strip()}")
        os.chmod(scratch, 0o700)
        os.replace(scratch, path)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return path


def guarded_environ(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the guard first in LD_PRELOAD, for a process about to start."""
    out = dict(os.environ if env is None else env)
    lib = str(library())
    others = [p for p in out.get("LD_PRELOAD", "").replace(":", " ").split() if p and p != lib]
    out["LD_PRELOAD"] = " ".join([lib, *others])
    return out


def require(unguarded_ok: bool) -> None:
    """Refuse a monarch context in a driver without the guard (FrayError naming the ways to start under it),
    unless the spec accepted that."""
    if unguarded_ok or active():
        return
    loaded = _loaded()
    if loaded is None and settings.SOCKET_GUARD_RESTARTED.read():
        raise _not_preloaded()
    if loaded is not None:
        try:
            why = _distrust(loaded)
        except OSError as exc:
            why = str(exc)
        raise FrayError(
            f"this process preloaded a socket guard from {loaded}, which is not to be trusted ({why}): start it "
            "again under fray's own (`python -m fray_monarch.socket_guard python ...`), with LD_PRELOAD naming "
            "nothing else of the kind"
        )
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "your_script.py"
    raise FrayError(
        "Monarch 0.7 listens on abstract Unix sockets that every user of this machine can connect to, and a "
        "message sent there runs code as you; fray's socket guard closes them to other users, but it must be "
        "loaded when the process starts and this one started without it. Start the driver under it: "
        f"`FRAY_BACKEND=monarch python {script}` (it restarts itself under the guard as Python starts), "
        f"`python -m fray_monarch.socket_guard python {script}`, `fray run -- python {script}`, or "
        "LD_PRELOAD=$(python -m fray_monarch.socket_guard) in its environment. On a machine no one else uses, "
        f"add {OPT_OUT}=true to the monarch spec instead. See docs/security.md."
    )


_warned_unguarded: list[bool] = []


def warn_unguarded() -> None:
    """Say once per process, when a monarch context starts with unguarded_sockets=true, what runs without the
    guard: the option travels to every process the context starts."""
    if _warned_unguarded:
        return
    _warned_unguarded.append(True)
    warnings.warn(
        f"fray: {OPT_OUT}=true: this driver and what it starts run without fray's socket guard: its Monarch worker "
        "processes, the host workers it launches over ssh or Slurm (they are given the option), and the jobs of a "
        "cluster made with it. Any user of these machines who finds their abstract socket names (listed to all in "
        "/proc/net/unix) can run code as you. Use it only where no one else has an account (docs/security.md)",
        RuntimeWarning,
        stacklevel=3,
    )


def restart_guarded(module: str, argv: list[str]) -> None:
    """Replace this process by `python -m module argv...` under the guard, unless it already runs under it."""
    if not active():
        restart_under_guard([sys.executable, "-m", module, *argv])


def _not_preloaded() -> FrayError:
    loaded = os.environ.get("LD_PRELOAD", "")
    return FrayError(
        f"this process was started again under fray's socket guard ({loaded}) and still runs without it: the "
        "loader could not preload the library (its message, above, says why: built for another machine, or gone). "
        f"Remove {_lib_dir()} and start again; on a machine no one else uses, {OPT_OUT}=true starts without it"
    )


def restart_under_guard(argv: list[str]) -> NoReturn:
    """Replace this process by `argv` (a Python command) under the guard. FrayError, naming why, if this process
    is that command started again already: the loader could not preload the library (built for another machine,
    or removed meanwhile), and starting again would loop."""
    if settings.SOCKET_GUARD_RESTARTED.read():
        raise _not_preloaded()
    env = guarded_environ()
    env[RESTARTED] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def main(argv: list[str]) -> int:
    """No arguments: print the library's path (for LD_PRELOAD). A command: run it under the guard."""
    try:
        if not argv:
            print(library())
            return 0
        if argv[0] in ("-h", "--help"):
            print(__doc__)
            return 0
        env = guarded_environ()
    except FrayError as exc:
        print(f"fray_monarch.socket_guard: {exc}", file=sys.stderr)
        return 2
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        print(f"fray_monarch.socket_guard: cannot run {argv[0]!r}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
