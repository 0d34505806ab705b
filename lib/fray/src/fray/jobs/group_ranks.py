"""A job's ranks over several nodes: each rank a member of an SPMD actor group of the job's own backend
(fray.jobs.supervisor --placement pack|spread). The backend places the members over its nodes by each rank's
resources, as it places any group (docs/groups.md), sets torch.distributed's variables in each member's process
(and serves the rendezvous store in rank 0's), gives each its GPUs, and ends them all when one dies.

A member runs its rank, the job's command or callable, in a subprocess of its own process group, which
fray.host.watchdog ends with the member however the member ends. The rank's output comes back through fray itself: the
supervisor polls each member (`poll`: the lines written since, and once the rank has ended and all its lines were
given, how it ended) and writes them to the job's log, "[rank I] " before each. So it does not depend on whether a
backend forwards a worker's console to its driver (Monarch's attached hosts do not), and nothing folds or
relabels the lines on the way (Ray's log deduplication and prefixes).

With ONE_NODE (`--placement node`: a job placed apart from its first process only so that this process holds
nothing) the group is every rank on one node (strict "pack"), as a job's ranks on its host are: while the nodes
could hold it but their resources are busy, it is asked for again until they are free (a job on its host waits for
them too), and each rank sees only its own GPUs (an SPMD member sees its node's members' devices, torchrun's view;
a rank on the job's host sees its own slice).
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from fray.errors import InfeasibleResourcesError
from fray.host import settings, watchdog
from fray.jobs.call import CALL_VAR, RESULT_FD_VAR, CallOutcome, read_outcome
from fray.jobs.requests import ONE_NODE
from fray.jobs.signals import unblock_in_child
from fray.runtime.groups import check_group_feasible
from fray.types import ActorOptions

__all__ = ["RankPoll", "RankProcess", "own_gpus_of", "rank_group"]

KEPT_LINES = 100_000  # lines a member keeps between two polls; older ones are dropped, and counted


@dataclass(frozen=True)
class RankPoll:
    """What a poll of one rank gives: the lines written since the last poll (and how many were dropped for want
    of room), and, once it has ended and every line was given, its exit code (negative: killed by that signal)
    and how its callable went."""

    lines: list[str] = field(default_factory=list)
    dropped: int = 0
    code: int | None = None
    call: CallOutcome | None = None


class RankProcess:
    """One member of a job's rank group: `start` starts the rank, `poll` follows it."""

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque()
        self._dropped = 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._threads: list[threading.Thread] = []
        self._outcome: list[CallOutcome] = []
        self._code: int | None = None

    def start(
        self, command: list[str] | None, call: str | None, attempt: int, resuming: str | None = None, own_gpus: int = 0
    ) -> str:
        """Start the rank (the command, or the callable FRAY_JOB_CALL would hold); this member's host name.
        own_gpus: the rank sees only its own that many GPUs (see own_gpus_of)."""
        env = dict(os.environ)
        if own_gpus:
            _see_own_gpus(env, own_gpus)
        env[settings.JOB_ATTEMPT.name] = str(attempt)
        if resuming is not None:  # (the supervisor's look at the job's directory: fray.jobs.dirs)
            env[settings.JOB_RESUMING.name] = resuming
        read_fd = write_fd = -1
        if call is not None:
            read_fd, write_fd = os.pipe()
            env[CALL_VAR] = call
            env[RESULT_FD_VAR] = str(write_fd)
            argv = [sys.executable, "-m", "fray.jobs.run_call"]
        else:
            assert command is not None
            argv = command
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(write_fd,) if write_fd >= 0 else (),
                start_new_session=True,  # its own group: the watchdog ends all of it with this member
                preexec_fn=unblock_in_child,  # a member started by the supervisor inherits its blocked SIGTERM
            )
        except OSError as exc:
            self._add(f"fray: could not start {argv[0]!r}: {exc}\n")
            self._code = 127
            return socket.gethostname()
        finally:
            if write_fd >= 0:
                os.close(write_fd)
        watchdog.watch_group(self._proc.pid)
        assert self._proc.stdout is not None
        self._threads = [
            threading.Thread(target=self._read, args=(self._proc.stdout,), name="fray-group-rank-output", daemon=True)
        ]
        if read_fd >= 0:
            self._threads.append(
                threading.Thread(
                    target=lambda: self._outcome.append(read_outcome(read_fd)),
                    name="fray-group-rank-outcome",
                    daemon=True,
                )
            )
        for thread in self._threads:
            thread.start()
        return socket.gethostname()

    def _add(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)
            if len(self._lines) > KEPT_LINES:
                self._lines.popleft()
                self._dropped += 1

    def _read(self, stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            self._add(line.decode(errors="replace"))
        stream.close()

    def terminate(self) -> None:
        """SIGTERM the rank's process group (a stop or preemption: it has the job's grace to end before the
        supervisor kills the group)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # its own group (start_new_session), not yet reaped: still its own
            except ProcessLookupError:
                pass

    def poll(self) -> RankPoll:
        """The lines since the last poll; the exit code once the rank has ended and all its lines are given."""
        code = self._code
        if code is None and self._proc is not None and self._proc.poll() is not None:
            for thread in self._threads:
                thread.join(5.0)  # the rest of its output (a grandchild holding it open is not waited for longer)
            watchdog.forget_group(self._proc.pid)
            code = self._code = self._proc.returncode
        with self._lock:
            lines, dropped = list(self._lines), self._dropped
            self._lines.clear()
            self._dropped = 0
        return RankPoll(lines, dropped, code, self._outcome[0] if code is not None and self._outcome else None)


def own_gpus_of(placement: str, per_rank: Mapping[str, float]) -> int:
    """How many GPUs a rank of a group placed so sees, only its own: ONE_NODE's ranks hold, else 0 (the member's
    view, which the rank inherits, stays)."""
    return int(per_rank.get("GPU", 0)) if placement == ONE_NODE else 0


def _see_own_gpus(env: dict[str, str], own: int) -> None:
    """Narrow an SPMD member's CUDA_VISIBLE_DEVICES (its node's members' devices, in local rank order, `own` each)
    to its own slice; a member that kept its own view (the devices of its node's members not all seen) keeps it."""
    entries = [e for e in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    local, size = int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", "1"))
    if len(entries) == own * size and size > 1:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(entries[local * own : (local + 1) * own])


def rank_group(
    ctx: Any,
    placement: str,
    count: int,
    per_rank: dict[str, float],
    stopping: threading.Event,
    say: Callable[[str], None],
) -> Any:
    """An attempt's group of `count` ranks (RankProcess members) in the job's fray context `ctx`, placed as
    `placement` says; a ONE_NODE group is asked for again while the nodes could hold it (see above), until the
    job stops."""
    options = ActorOptions(resources=per_rank)
    if placement != ONE_NODE:
        return ctx.create_actor_group(RankProcess, count, options=options, placement=placement, distributed=True)
    waiting = False
    while True:
        try:
            return ctx.create_actor_group(
                RankProcess, count, options=options, placement="pack", strict_placement=True, distributed=True
            )
        except InfeasibleResourcesError:
            # never placed on the nodes there are now (one was lost): the attempt fails, not started
            check_group_feasible(ctx.node_resources(), per_rank, count, "pack", True, "the job's ranks")
            if stopping.is_set():
                raise
            if not waiting:
                waiting = True
                say(f"waiting for a node with room for the {count} ranks (its resources are busy)")
