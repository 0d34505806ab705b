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

The library is built once per user from its C source with the machine's C compiler (`cc`, or $CC) into
~/.fray/lib (~/.fray and it 0700, whatever the umask), named by the hash of the source, and checked each time it
is used, and in a process that preloaded it (`active`): a regular file of this user's that no one else can write,
every directory on the way to it this user's or root's and writable by no one else (fray_monarch.core.trust), so
no member of a shared group can swap the library every process of this user preloads.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from fray.errors import FrayError
from fray.jobs import private_dir
from fray_monarch.core.trust import fray_home, untrusted_reason

__all__ = ["active", "guarded_environ", "library", "require", "restart_guarded"]

SOURCE = Path(__file__).with_name("socket_guard.c")
MARKER = "fray_socket_guard_version"  # a symbol of the library: found in a process that preloaded it
OPT_OUT = "unguarded_sockets"  # the spec option that accepts a driver without the guard
BUILD_TIMEOUT = 60.0


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
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        return f"{path} is not a regular file of this user's that only this user can write"
    return untrusted_reason(path)


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
    """The guard library's path, built here first if this user has none of this source yet."""
    source = SOURCE.read_bytes()
    lib_dir = _lib_dir()
    path = lib_dir / f"socket-guard-{hashlib.sha256(source).hexdigest()[:16]}.so"
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


def restart_guarded(module: str, argv: list[str]) -> None:
    """Replace this process by `python -m module argv...` under the guard, unless it already runs under it."""
    if active():
        return
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], guarded_environ())


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
