"""A job's ranks on its supervisor's host (fray.jobs.supervisor): their processes, GPUs, output and signals."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO

from fray.host.procfs import Identity, children_of
from fray.jobs.call import CallOutcome

__all__ = [
    "VISIBLE",
    "Rank",
    "become_subreaper",
    "descendants",
    "end_leftovers",
    "free_port",
    "gpu_slices",
    "prefix_lines",
    "signal_tree",
]

VISIBLE = "CUDA_VISIBLE_DEVICES"
_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Rank:
    index: int
    proc: subprocess.Popen[bytes]
    threads: list[threading.Thread] = field(default_factory=list)
    outcome: list[CallOutcome] = field(default_factory=list)  # a callable's, once read


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpu_slices(replicas: int, per_rank: int) -> list[str | None]:
    """Each rank's CUDA_VISIBLE_DEVICES: consecutive slices of what this process sees (its CUDA_VISIBLE_DEVICES,
    else the host's GPUs)."""
    if per_rank <= 0:
        return [None] * replicas
    from fray.runtime.gpus import discover  # only where GPUs are asked for (it may run nvidia-smi)

    given = os.environ.get(VISIBLE)
    entries = [e.strip() for e in given.split(",") if e.strip()] if given is not None else list(discover().entries)
    if len(entries) < replicas * per_rank:
        raise ValueError(
            f"{replicas} ranks of {per_rank} GPU(s) each need {replicas * per_rank} GPUs; this host shows the job "
            f"{len(entries)} ({VISIBLE}={given!r})"
        )
    return [",".join(entries[i * per_rank : (i + 1) * per_rank]) for i in range(replicas)]


def prefix_lines(stream: IO[bytes], index: int, lock: threading.Lock) -> None:
    out = sys.stdout.buffer
    prefix = f"[rank {index}] ".encode()
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
            out.flush()
    stream.close()


def descendants(pid: int) -> list[Identity]:
    found, queue = [], [pid]
    while queue:
        for child in children_of(queue.pop()):
            identity = Identity.of(child)
            if identity is not None:
                found.append(identity)
                queue.append(child)
    return found


def signal_tree(rank: Rank, signum: int) -> None:
    """Signal a rank and every process under it, each only while proven the one listed (pid, start time)."""
    if rank.proc.poll() is not None:
        return
    targets = descendants(rank.proc.pid)
    try:
        rank.proc.send_signal(signum)  # our child, not yet reaped: its pid is still its own
    except ProcessLookupError:
        pass
    for identity in targets:
        if identity.running():
            try:
                os.kill(identity.pid, signum)
            except ProcessLookupError:
                pass


def become_subreaper() -> bool:
    """Make this process the subreaper of what it starts (prctl PR_SET_CHILD_SUBREAPER): a process a rank leaves
    behind when it dies is then this process's child, found and ended by end_leftovers. False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def end_leftovers(rounds: int = 20) -> list[int]:
    """SIGKILL and reap every child of this process: once an attempt's ranks are reaped, those are what they left
    behind (reparented here: become_subreaper), whose own children come next. Each is our child, not yet reaped,
    so its pid is still its own. The pids ended."""
    ended: list[int] = []
    for _ in range(rounds):
        children = children_of(os.getpid())
        if not children:
            break
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        ended += children
    return ended
