"""Who asked a job's supervisor to end: fray's own stop, or a preemption.

Every backend stops a job by signalling its first process (fray.jobs.supervisor) from the process that started it:
fray.jobs.local.LocalJobs (in_memory, monarch's job runners) is its parent, Ray's job supervisor actor is its parent or,
through the shell Ray runs a command with, its grandparent. So a SIGTERM whose sender (siginfo's si_pid) is that
owner is a stop; a SIGTERM from anyone else (a scheduler, a Slurm preemption, a host shutting down, `kill` by hand)
is a preemption, and the attempt it ends is lost, not failed. SIGINT is always a stop. A detached job is stopped
by whichever process asks (`fray job stop`), which first leaves a mark in the job's directory (FRAY_JOB_STOP_MARK
names it): a SIGTERM with the mark there is a stop too.

The sender is known only to sigwaitinfo: the signals are blocked in the supervisor (before it starts any thread, so
every thread has them blocked) and one thread waits for them. The ranks must not inherit the block:
`unblock_in_child` is their Popen's preexec_fn.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass

from fray.host import settings
from fray.host.procfs import cmdline, stat

__all__ = ["STOP_MARK_VAR", "StopRequest", "StopSignals", "unblock_in_child"]

STOP_MARK_VAR = settings.JOB_STOP_MARK.name

SIGNALS = {signal.SIGTERM, signal.SIGINT}
_SHELLS = {"sh", "dash", "bash", "zsh", "ksh"}


@dataclass(frozen=True)
class StopRequest:
    preempted: bool  # SIGTERM from someone other than the job's owner
    sender: int  # its pid (0: the kernel)
    signum: int

    @property
    def reason(self) -> str:
        name = signal.Signals(self.signum).name
        if not self.preempted:
            return f"stopped ({name} from the backend)"
        return f"preempted: the supervisor got {name} from pid {self.sender}" if self.sender else "preempted"


def _owners() -> frozenset[int]:
    """The processes whose signals are fray's stop: the parent, and its parent when the parent is a shell."""
    parent = os.getppid()
    owners = {parent}
    argv = cmdline(parent) or []
    if argv and os.path.basename(argv[0]) in _SHELLS:
        found = stat(parent)
        if found is not None and found.ppid > 1:
            owners.add(found.ppid)
    return frozenset(owners)


def _marked() -> bool:
    mark = settings.JOB_STOP_MARK.read()
    return mark is not None and os.path.lexists(mark)


def unblock_in_child() -> None:
    """A rank's Popen preexec_fn: the signals the supervisor blocked are the rank's to handle (its SIGTERM handler)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


class StopSignals:
    """Blocks SIGTERM and SIGINT in this process and waits for them on a thread; `requested` is set at the first
    (and `request` says who sent it). Call before starting any other thread."""

    def __init__(self) -> None:
        self.owners = _owners()
        self.requested = threading.Event()
        self.request: StopRequest | None = None
        self._lock = threading.Lock()
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        threading.Thread(target=self._wait, name="fray-stop-signals", daemon=True).start()

    def _wait(self) -> None:
        while True:
            info = signal.sigwaitinfo(SIGNALS)
            preempted = info.si_signo == signal.SIGTERM and info.si_pid not in self.owners and not _marked()
            with self._lock:
                if self.request is None or (self.request.preempted and not preempted):
                    self.request = StopRequest(preempted, info.si_pid, info.si_signo)  # a stop outranks a preemption
            self.requested.set()

    def take_preemption(self) -> StopRequest | None:
        """The preemption that ended an attempt, now handled (the next attempt may run), else None (a stop stays)."""
        with self._lock:
            request = self.request
            if request is None or not request.preempted:
                return None
            self.request = None
            self.requested.clear()
            return request

    @property
    def stopping(self) -> bool:
        """A stop (not a preemption) was asked for: nothing runs again."""
        request = self.request
        return request is not None and not request.preempted
