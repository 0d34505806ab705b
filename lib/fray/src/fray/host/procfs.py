"""This machine's processes, as /proc shows them: the one place fray reads them, and the proof that a recorded
process is still the one fray started before anything signals it.

A pid alone proves nothing: after the process ends, or after a reboot, the number goes to whatever starts next.
So fray records a process as an `Identity` (pid, start time in clock ticks, the kernel's boot id) and signals a
process or its group only while that identity still holds. A process group is signalled when its leader is
proven to be the recorded one, or when the leader has ended and the group lives on in the same boot: Linux hands
out no pid that is still the id of a live process group, so such a group can only be the recorded leader's.

/proc/PID/stat is parsed after the last ')': a process name may hold spaces and parentheses.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Identity",
    "ProcStat",
    "alive",
    "boot_id",
    "children_of",
    "cmdline",
    "end_children",
    "exiting",
    "gone",
    "group_members",
    "pids",
    "stat",
    "state",
    "stop_group",
    "stop_groups",
]


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat fray uses."""

    pid: int
    state: str  # R, S, D, Z (zombie), X (dead), T (stopped)...
    ppid: int
    pgid: int
    session: int
    start: int  # clock ticks after boot

    @property
    def live(self) -> bool:
        return self.state not in ("Z", "X")


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()


def stat(pid: int) -> ProcStat | None:
    """The process `pid` as /proc shows it now, or None if there is none."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        return ProcStat(pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def state(pid: int) -> str | None:
    """The state letter of process `pid` (R, S, D, Z, X, T...), or None if there is no such process."""
    fields = _stat_fields(pid)
    return fields[0].decode() if fields else None


def cmdline(pid: int) -> list[str] | None:
    """The argv of process `pid` (undecodable bytes replaced; empty for a zombie or a kernel thread), or None if
    it cannot be read (no such process, or not ours to read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # Each argument ends in NUL, but a process that rewrote its title (Ray's workers) may end without one.
    return raw.removesuffix(b"\0").decode(errors="replace").split("\0") if raw else []


def pids() -> list[int]:
    """The pids of every process of this machine (as this process's pid namespace sees them) now."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


_PF_EXITING = 0x4  # (linux/sched.h) the process has begun to exit


def exiting(pid: int) -> bool:
    """Process `pid` of this machine has begun to exit (SIGKILLed, say), or is gone: what is sent to it now is
    lost, though fray may not know of its death yet (a process with torch loaded takes a while to end)."""
    fields = _stat_fields(pid)
    if fields is None:
        return True
    try:
        return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)
    except (IndexError, ValueError):
        return False


def alive(pid: int) -> bool:
    """A process `pid` runs (a zombie does not)."""
    found = stat(pid)
    return found is not None and found.live


def gone(pid: int) -> bool:
    """Process `pid` has exited: there is none, or it is a zombie (its code no longer runs)."""
    return not alive(pid)


def _live() -> list[ProcStat]:
    found = []
    for pid in pids():
        seen = stat(pid)
        if seen is not None and seen.live:
            found.append(seen)
    return found


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid`."""
    return [p.pid for p in _live() if p.pgid == pgid]


def children_of(pid: int) -> list[int]:
    """Live children of process `pid`."""
    return [p.pid for p in _live() if p.ppid == pid]


_boot: str | None = None


def boot_id() -> str:
    """This boot of the kernel ("" where there is no /proc): the same pid in another boot is another process."""
    global _boot
    if _boot is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _boot = f.read().strip()
        except OSError:
            _boot = ""
    return _boot


@dataclass(frozen=True)
class Identity:
    """A process as fray recorded it: pid, start time and boot."""

    pid: int
    start: int
    boot: str

    @staticmethod
    def of(pid: int, zombie_ok: bool = False) -> Identity | None:
        """The identity of the live process `pid` now (None if none runs). `zombie_ok`: also of one that has
        ended but is not reaped yet (the caller's own child, recorded right after it started)."""
        found = stat(pid)
        if found is None or not (found.live or zombie_ok):
            return None
        return Identity(pid, found.start, boot_id())

    @staticmethod
    def from_record(data: Any) -> Identity | None:
        """An identity stored by `record()` (None for a record without one)."""
        if not isinstance(data, dict):
            return None
        try:
            return Identity(int(data["pid"]), int(data["start"]), str(data["boot"]))
        except (KeyError, TypeError, ValueError):
            return None

    def record(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "boot": self.boot}

    def running(self) -> bool:
        """The recorded process still runs (same pid, start time and boot)."""
        now = Identity.of(self.pid)
        return now is not None and now == self

    def group_is_ours(self) -> bool:
        """The process group this process leads may be signalled: it leads it still, or it ended and its group
        lives on in the same boot (a pid is never handed out while a live group has that id)."""
        if self.boot != boot_id():
            return False
        now = stat(self.pid)
        if now is not None and now.live:
            return now.start == self.start
        return bool(group_members(self.pid))


def stop_group(leader: Identity, grace: float = 3.0) -> bool:
    """SIGTERM the process group `leader` leads, SIGKILL what is left after `grace` seconds; True once none of
    it runs. Nothing is signalled unless the group is proven to be the recorded leader's (Identity.group_is_ours):
    a group that is not is left alone, and counts as stopped."""
    return stop_groups([leader], grace)


def stop_groups(leaders: list[Identity], grace: float = 3.0) -> bool:
    """stop_group for several groups at once: each signal goes to all of them before the wait, so the grace is
    spent once, not once per group. True once none of the groups proven ours runs."""
    left: list[Identity] = list(leaders)
    refused: list[Identity] = []  # not ours to signal after all (another user's): not waited for
    for signum in (signal.SIGTERM, signal.SIGKILL):
        signalled = []
        for leader in left:
            if not leader.group_is_ours():
                continue  # ended (or never ours): left alone, stopped
            try:
                os.killpg(leader.pid, signum)
            except ProcessLookupError:
                continue  # its last member ended since the check
            except PermissionError:
                refused.append(leader)
                continue
            signalled.append(leader)
        deadline = time.monotonic() + grace
        while any(group_members(g.pid) for g in signalled) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = signalled
    return not any(group_members(g.pid) for g in left + refused)


def end_children(children: list[Identity], grace: float = 5.0) -> list[int]:
    """Wait up to `grace` seconds for these processes to end, then SIGKILL each one still running that is proven
    the recorded process (pid, start time, boot) and a child of this process; wait up to `grace` again for them
    to go. Returns the pids still running (none, unless a process outlived its SIGKILL or is not ours)."""
    deadline = time.monotonic() + grace
    left = [c for c in children if c.running()]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [c for c in left if c.running()]
    for child in left:
        now = stat(child.pid)
        if now is not None and now.ppid == os.getpid() and child.running():
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [c for c in left if c.running()]
    return [c.pid for c in left]
