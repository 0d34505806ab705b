"""An in_memory SPMD group's shared fate: its members (child processes: _process_member.py) fail and restart as one.

Each member's process is watched by a thread waiting for its exit. The first exit fray did not cause ends the
group's current generation: every member's process is SIGKILLed at once (a survivor blocked in a collective
cannot leave it otherwise) and every call pending on any member fails: with ActorUnavailableError when a restart
is left (`ActorOptions.max_restarts`), then every member comes back on a fresh process with a new MASTER_PORT and
runs __init__ again (all ranks at once, as at creation; `fray.current_actor().restarts` counts); with
ActorDiedError naming the rank that died when none is left. Calls submitted while the group restarts belong to
its next life: they wait for the restart and then run (their caller's get timeout bounds the wait), or fail with
the group's ActorDiedError if the restart fails. A member whose process sends no heartbeat for `hang_timeout`
seconds (stopped, or its machine gone quiet) counts as dead the same way (fray.runtime.gang.hang_timeout).
"""

from __future__ import annotations

import math
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Protocol

from fray.backend import (
    RECORDER,
    Kind,
    died_error,
    free_port,
    heartbeat_interval,
    hung,
    hung_reason,
    restarting_error,
)
from fray.errors import ActorUnavailableError, FrayError

__all__ = ["Gang", "GangMember"]


class GangMember(Protocol):
    """What a gang needs of a member's process (in_memory/_process_member.py's ProcessMember keeps it)."""

    def stop_process(self) -> None: ...
    def exiting(self) -> bool: ...
    def respawn(self, env: dict[str, str], restarts: int, generation: int) -> None: ...


class Gang:
    """The members of one SPMD group, by rank, and the group's state: `generation` counts the group's lives
    (0 at creation, +1 at each failure); `failures[g]` is why life g ended."""

    def __init__(self, label: str, size: int, max_restarts: int, hang_timeout: float = math.inf) -> None:
        self.label = label
        self.hang_timeout = hang_timeout  # seconds without a heartbeat from a member's process: it is dead
        self.size = size
        self.max_restarts = max_restarts
        self.members: dict[int, GangMember] = {}
        self.started = False  # every member's first __init__ returned: a death from now on may restart
        self.restarts = 0
        self.generation = 0
        self.failures: dict[int, FrayError] = {}
        self.error: FrayError | None = None  # ActorUnavailableError while restarting; ActorDiedError when dead
        self.dead = False
        self.cond = threading.Condition()
        self.devices: dict[int, tuple[int, ...]] = {}  # rank -> the GPUs that member holds
        self._up: dict[tuple[int, int], float] = {}  # (rank, generation) -> when that process's __init__ returned

    def devices_of_all(self, rank: int, held: tuple[int, ...], given_up: Callable[[], bool]) -> list[int]:
        """Every member's GPUs in rank order, once each member has said which it holds (`held`: this rank's). The
        members' processes rendezvous anyway, so none is started before all hold theirs; `given_up()` ends the
        wait early (this member was killed), with what is known then."""
        with self.cond:
            self.devices[rank] = held
            self.cond.notify_all()
            while len(self.devices) < self.size and not self.dead and not given_up():
                self.cond.wait(0.5)
            return [device for r in sorted(self.devices) for device in self.devices[r]]

    # ------------------------------------------------------------ members
    def joined(self, rank: int, member: GangMember) -> None:
        """A member's process runs its first __init__ successfully."""
        with self.cond:
            self.members[rank] = member
            self.started = len(self.members) == self.size

    def up(self, rank: int, generation: int) -> None:
        """The __init__ of rank `rank`'s process of life `generation` returned: its silences count in full."""
        self._up[(rank, generation)] = time.monotonic()

    def watch(self, rank: int, proc: subprocess.Popen[bytes], generation: int, beats: int) -> None:
        """Learn of the exit of a member's process (of the group's life `generation`), and of its silence: its
        heartbeats arrive on the pipe `beats` (closed here)."""

        def await_exit() -> None:
            code = proc.wait()
            self.died(rank, generation, f"its process exited with code {code}", exited=(proc.pid, code))

        def await_silence() -> None:
            interval = None if math.isinf(self.hang_timeout) else heartbeat_interval(self.hang_timeout)
            silent_since = time.monotonic()
            try:
                while True:
                    ready, _, _ = select.select([beats], [], [], interval)
                    now = time.monotonic()
                    if ready:
                        if not os.read(beats, 4096):
                            return  # its process exited: await_exit says so
                        silent_since = now
                    elif hung(silent_since, now, self.hang_timeout, self._up.get((rank, generation))):
                        self.died(rank, generation, hung_reason(self.hang_timeout))  # (SIGKILLs a stopped one)
                        return
            finally:
                os.close(beats)
                self._up.pop((rank, generation), None)

        threading.Thread(target=await_exit, name=f"fray-gang-watch-{rank}", daemon=True).start()
        threading.Thread(target=await_silence, name=f"fray-gang-beats-{rank}", daemon=True).start()

    # ------------------------------------------------------------ calls
    def life(self) -> int:
        """The group's life a call submitted now belongs to: the current one; while the group restarts, the one
        the restart brings; and the next one when a member's process has begun to exit but its death is not seen
        yet (a process with torch takes a while to end after a SIGKILL: the call was in flight at no death). Its
        calls wait for that life (`ready`)."""
        with self.cond:
            if self.error is None and not self.dead and any(m.exiting() for m in self.members.values()):
                return self.generation + 1
            return self.generation

    def ready(self, life: int) -> None:
        """Wait until life `life` of the group can take a call (the coming death is seen and a restart brings it
        up), and return; raise why it ended if it has ended (the call was submitted before a death, or the
        restart failed), or the group's error once it is dead. Bounded by the death and the restart: the watcher
        of the exiting process sees its end, and a restart ends by coming back, by a failed __init__ or by a
        kill, each of which notifies; the caller's own wait is bounded by its get's timeout."""
        with self.cond:
            while not self.dead and (self.generation < life or (self.generation == life and self.error is not None)):
                self.cond.wait(1.0)
            if self.generation != life:
                failure = self.failures.get(life)
                raise _copy(failure) if failure is not None else ActorUnavailableError(f"{self.label} restarted")
            if self.error is not None:
                raise _copy(self.error)

    def failure_since(self, generation: int, wait: float) -> FrayError | None:
        """Why life `generation` ended (waiting up to `wait` seconds for it to end); None if it goes on."""
        with self.cond:
            self.cond.wait_for(lambda: self.generation != generation, timeout=wait)
            failure = self.failures.get(generation)
            return None if failure is None else _copy(failure)

    # ------------------------------------------------------------ deaths and restarts
    def died(
        self, rank: int, generation: int, why: str, restart: bool = True, exited: tuple[int, int] | None = None
    ) -> None:
        """A member's process of life `generation` ended (or it was killed: restart=False): end that life.
        exited: (pid, exit code) of a process that ended by itself, recorded as a worker's death."""
        with self.cond:
            if generation != self.generation or self.dead:
                return  # a process fray stopped itself, or of a life already ended
            if exited is not None:
                pid, code = exited
                data = {"reason": f"rank {rank}: {why}", "exit_code": code}
                RECORDER.record(Kind.WORKER_DIED, pid, f"process of rank {rank} of {self.label}", data)
            self.generation += 1
            can_restart = self.max_restarts == -1 or self.restarts < self.max_restarts
            if restart and self.started and can_restart:
                self.restarts += 1
                self.error = restarting_error(self.label, rank, why, self.restarts, self.max_restarts)
                RECORDER.record(Kind.GROUP_RESTART, self.label, self.label, {"reason": f"rank {rank}: {why}"})
            else:
                self.dead = True
                self.error = died_error(self.label, rank, why)
            self.failures[generation] = self.error
            members = list(self.members.values())
            restarting = not self.dead
            self.cond.notify_all()
        for member in members:
            member.stop_process()
        if restarting:
            threading.Thread(
                target=self._restart, args=(self.generation, rank), name="fray-gang-restart", daemon=True
            ).start()

    def _restart(self, generation: int, lost: int) -> None:
        """Every member on a fresh process, a new MASTER_PORT, __init__ on every rank at once; all or nothing."""
        port = str(free_port())
        failed: list[BaseException] = []

        def respawn(member: GangMember) -> None:
            try:
                member.respawn({"MASTER_PORT": port}, self.restarts, generation)
            except BaseException as exc:
                failed.append(exc)
                self._give_up(generation, lost, f"the restart failed: {type(exc).__name__}: {exc}")

        with self.cond:
            members = list(self.members.values())
        threads = [threading.Thread(target=respawn, args=(m,), name="fray-gang-respawn", daemon=True) for m in members]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with self.cond:
            if not failed and self.generation == generation and not self.dead:
                self.error = None
                self.cond.notify_all()

    def _give_up(self, generation: int, rank: int, why: str) -> None:
        """A restart that failed: the group is dead; the processes started for it are stopped."""
        with self.cond:
            if self.dead or generation != self.generation:
                return
            self.generation += 1
            self.dead = True
            self.error = self.failures[generation] = died_error(self.label, rank, why)
            members = list(self.members.values())
            self.cond.notify_all()
        for member in members:
            member.stop_process()


def _copy(error: FrayError) -> FrayError:
    """A fresh exception of the same type and message for each call (one raised object would chain tracebacks)."""
    return type(error)(str(error))
