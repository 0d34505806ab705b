"""A watchdog process that cleans up after its owner, however the owner ends.

SIGKILL cannot be caught, and what fray starts is not always the owner's child (a Ray head's agents, a job's
own children). So the owner starts one small watchdog process (lazily, the first time something needs
watching) and keeps the write end of a pipe to it. The watchdog reads what to clean from the pipe; when the
pipe closes, the owner is gone (exit, exception, SIGINT, SIGTERM, SIGKILL alike): the watchdog runs
the commands it was given (e.g. `scancel` of a Slurm allocation a driver launched), sends SIGTERM to
the process groups it was given and SIGKILL to what is left after a grace period, removes the paths, and exits.

    python -m fray.host.watchdog OWNER_PID     (started by `watch_group` / `watch_path`; reads its stdin)

Things the owner stops itself (a clean shutdown) are taken off the list with `forget_group` / `forget_path` /
`forget_prefix`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

from fray.host.procfs import Identity, stop_groups

__all__ = [
    "forget_command",
    "forget_group",
    "forget_path",
    "forget_prefix",
    "watch_command",
    "watch_group",
    "watch_path",
    "watch_prefix",
]

GRACE = 3.0  # seconds between SIGTERM and SIGKILL of a watched group
COMMAND_TIMEOUT = 30.0  # seconds a cleanup command may take

_lock = threading.Lock()
_pipe: int | None = None
_owner_pid: int | None = None
_watched: dict[str, int] = {}  # what the running watchdog was told to clean, by key, with a count


def _send(line: str, key: str, forget: bool = False) -> None:
    """Tell the watchdog `line`. A watch of `key` starts a watchdog if none runs for this process; a forget of
    what is not watched says nothing. When the last watched thing is forgotten, the pipe closes and the watchdog,
    with nothing to clean, exits: after a clean shutdown nothing fray started remains, its watchdog included."""
    global _pipe, _owner_pid
    with _lock:
        if _owner_pid != os.getpid():  # inherited across a fork: that watchdog belongs to the parent
            _pipe, _owner_pid = None, os.getpid()
            _watched.clear()
        if forget:
            if _watched.get(key, 0) == 0 or _pipe is None:
                return
            os.write(_pipe, (line + "\n").encode())
            _watched[key] -= 1
            if _watched[key] == 0:
                del _watched[key]
            if not _watched:
                os.close(_pipe)
                _pipe = None
            return
        if _pipe is None:
            read_end, write_end = os.pipe()  # both non-inheritable: a job never holds the write end open
            subprocess.Popen(
                [sys.executable, "-m", "fray.host.watchdog", str(os.getpid())],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the owner's terminal must not reach it first
                close_fds=True,
            )
            os.close(read_end)
            _pipe = write_end
        os.write(_pipe, (line + "\n").encode())
        _watched[key] = _watched.get(key, 0) + 1


def watch_group(pgid: int) -> None:
    """Kill process group `pgid` when this process ends, unless forgotten first. Its leader (process `pgid`, alive
    now) is recorded with its start time and boot: the watchdog signals the group only while it is proven the same
    one (fray.host.procfs.Identity.group_is_ours), never a group that later got that number."""
    leader = Identity.of(pgid, zombie_ok=True)
    if leader is not None:
        _send(f"group {json.dumps(leader.record())}", f"group {leader.pid}")


def forget_group(pgid: int) -> None:
    _send(f"-group {pgid}", f"group {pgid}", forget=True)


def watch_path(path: str) -> None:
    """Remove `path` (a file or a directory tree) when this process ends, unless forgotten first."""
    _send(f"path {path}", f"path {path}")


def forget_path(path: str) -> None:
    _send(f"-path {path}", f"path {path}", forget=True)


def watch_prefix(prefix: str) -> None:
    """Remove every entry of directory dirname(`prefix`) whose name starts with basename(`prefix`) (files made
    later included) when this process ends, unless forgotten first. E.g. "/dev/shm/fray.<context>." names every
    shared-memory file of one context, whichever process made it."""
    if not os.path.basename(prefix):
        raise ValueError(f"a prefix must name the start of an entry, not a whole directory: {prefix!r}")
    _send(f"prefix {os.path.abspath(prefix)}", f"prefix {os.path.abspath(prefix)}")


def forget_prefix(prefix: str) -> None:
    _send(f"-prefix {os.path.abspath(prefix)}", f"prefix {os.path.abspath(prefix)}", forget=True)


def _command_line(argv: list[str], env: dict[str, str] | None) -> str:
    return json.dumps({"argv": list(argv), "env": dict(env or {})}, sort_keys=True)


def watch_command(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run `argv` (with `env` added to the watchdog's environment) when this process ends, unless forgotten first:
    for what no signal on this machine can end (a Slurm allocation: `scancel ID`)."""
    line = _command_line(argv, env)
    _send(f"command {line}", f"command {line}")


def forget_command(argv: list[str], env: dict[str, str] | None = None) -> None:
    line = _command_line(argv, env)
    _send(f"-command {line}", f"command {line}", forget=True)


def _run_command(line: str) -> None:
    try:
        spec = json.loads(line)
        subprocess.run(
            spec["argv"],
            env={**os.environ, **spec.get("env", {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=COMMAND_TIMEOUT,
        )
    except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError):
        pass


def main(argv: list[str]) -> int:
    # Only the pipe's end means the owner is gone: a scheduler that ends a job signals every process of it at once
    # (a Slurm preemption: SIGTERM, then SIGKILL of those it still tracks), and the watchdog must outlive the SIGTERM
    # to end the groups it was given, which a scheduler tracking processes by parent no longer finds once their
    # parent is dead.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    groups: list[Identity] = []  # a list, like paths: watched twice and forgotten once is still watched
    paths: list[str] = []
    prefixes: list[str] = []
    commands: list[str] = []
    for raw in sys.stdin.buffer:  # until EOF: the owner's end of the pipe closed
        kind, _, value = raw.decode(errors="replace").strip().partition(" ")
        if kind == "group":
            leader = Identity.from_record(json.loads(value))
            if leader is not None:
                groups.append(leader)
        elif kind == "-group":
            same = [leader for leader in groups if leader.pid == int(value)]
            if same:
                groups.remove(same[0])
        elif kind == "path":
            paths.append(value)
        elif kind == "-path" and value in paths:
            paths.remove(value)
        elif kind == "prefix":
            prefixes.append(value)
        elif kind == "-prefix" and value in prefixes:
            prefixes.remove(value)
        elif kind == "command":
            commands.append(value)
        elif kind == "-command" and value in commands:
            commands.remove(value)
    for command in commands:  # first: an allocation cancelled ends its processes on every host
        _run_command(command)
    stop_groups(list({leader.pid: leader for leader in groups}.values()), GRACE)
    for prefix in prefixes:
        folder, start = os.path.split(prefix)
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        paths.extend(os.path.join(folder, name) for name in names if start and name.startswith(start))
    for path in paths:
        _remove(path)
    return 0


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
