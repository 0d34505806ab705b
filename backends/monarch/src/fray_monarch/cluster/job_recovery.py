"""A monarch cluster's jobs after the Slurm allocation holding its hosts (`job=slurm`) was preempted: every host
went at once, each job runner and each job's supervisor with it.

The jobs' directories and logs are on storage the allocation's nodes share with the driver (the state directory,
as the TLS authority and Slurm's output are), so they outlive the hosts. When the lifeline of a job runner closes,
the context asks Slurm whether it took the allocation (slurm_alloc.SlurmAllocation.taken). If it was requeued, the
context waits (preempt_wait= s) for its next run, attaches to that run's host workers, starts a job runner on each,
and there: runs again each supervised job that had not ended, its attempt that ran `lost` (FRAY_JOB_RECOVERY:
fray.jobs.recovery), its log going on; lists each job that had ended as it ended; and ends each plain command that
had not, FAILED (it has no attempts to go on from). If it was not requeued, or its next run did not come within the
wait, every job that had not ended ends FAILED, a supervised one's record saying its last attempt was lost and why,
and a stand-in of each runner in the driver answers for the jobs from their logs. Where Slurm did not take the
allocation (or the cluster is not a Slurm allocation), the lost host alone is looked into (host_recovery.py)."""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fray import JobAttempt
from fray.backend import (
    RECOVERY_VAR,
    JobInfo,
    JobStatus,
    LocalJobs,
    RuntimeEnv,
    ended_before,
    has_record,
    is_supervised,
    log_end_with_record,
    lost_for_good,
    read_log_end,
    recovery_value,
    settings,
)
from fray.errors import FrayError
from fray_monarch.core.protocol import Reply
from fray_monarch.net import network

if TYPE_CHECKING:
    from fray_monarch.cluster.host_set import HostSet

__all__ = ["ATTACH_WAIT", "PREEMPT_WAIT", "AllocationRecovery", "ContextHooks", "StandInEndpoint", "Submitted"]

log = logging.getLogger("fray_monarch")

PREEMPT_WAIT = 600.0  # seconds a requeued allocation has to run again (preempt_wait=)
TAKEN_WITHIN = 3.0  # seconds after a runner's lifeline closed during which Slurm is asked whether it took the hosts
ENDING_WITHIN = 300.0  # seconds Slurm may take to end an allocation it is ending (COMPLETING) before it says how
ATTACH_WAIT = 120.0  # seconds the host workers of the allocation's next run have to answer
HOST_WAIT = 120.0  # seconds the jobs of one lost host take to be started again elsewhere (probe, then each start)


@dataclass(frozen=True)
class Submitted:
    """What a job was started with, to start it again."""

    entrypoint: str | list[str]
    env: RuntimeEnv
    working_dir: str | None

    @property
    def command(self) -> str:
        """The entrypoint as one command line (what is_supervised reads)."""
        return self.entrypoint if isinstance(self.entrypoint, str) else shlex.join(self.entrypoint)

    def env_to_run_again(
        self, tail: str, reason: str, started: float | None, lost_at: float, specs: tuple[str, str]
    ) -> RuntimeEnv:
        """Its environment for the attempt after one lost (`reason`): FRAY_JOB_RECOVERY from the end of its log
        (`tail`), and FRAY_BACKEND changed from specs[0] (the jobs' before) to specs[1] (now) where it was the
        jobs' own, not the job's."""
        extra = {RECOVERY_VAR: recovery_value(tail, reason, started, lost_at)}
        before, now = specs
        if self.env.env.get(settings.BACKEND.name) == before != now:
            extra[settings.BACKEND.name] = now
        return replace(self.env, env={**self.env.env, **extra})


def record_tail(root: str, job_id: str) -> str:
    """The end of a job's log under a runner's root from its last record on; OSError where it has none there."""
    path = Path(root) / job_id / "log"
    return log_end_with_record(lambda lines: read_log_end(path, lines))


def final_state(tail: str) -> tuple[JobStatus, JobAttempt] | None:
    """How a job ended by its final record in `tail` (its status, its last attempt), or None if it had not."""
    record = ended_before(tail)
    if record is None or not record.attempts:
        return None
    last = record.attempts[-1]
    status = {"succeeded": JobStatus.SUCCEEDED, "stopped": JobStatus.STOPPED}.get(last.outcome, JobStatus.FAILED)
    return status, last


class _Answer:
    def __init__(self, reply: Reply) -> None:
        self.reply = reply

    def get(self, timeout: float | None = None) -> Reply:
        return self.reply


class StandInEndpoint:
    """An endpoint of a job runner's stand-in in the driver: call_one(...).get() as a runner's answers."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def call_one(self, *args: Any) -> _Answer:
        try:
            return _Answer(Reply(self._call(*args)))
        except Exception as exc:
            return _Answer(Reply(error=exc))


class _EndedRunner:
    """A job runner's stand-in in the driver, for jobs whose hosts are gone for good: it answers from their logs,
    as the runner did (the endpoints the context calls)."""

    def __init__(self, root: str, why: str) -> None:
        self.jobs = LocalJobs(Path(root), totals={})
        self.why = why

    def _refuse(self, *args: Any) -> Any:
        raise FrayError(f"this cluster's hosts are lost ({self.why}): it runs no more jobs; start a new one")

    def __getattr__(self, endpoint: str) -> StandInEndpoint:
        calls = {
            "info": self.jobs.info,
            "list": self.jobs.list,
            "logs": self.jobs.logs,
            "log_end": self.jobs.log_end,
            "stop_job": self.jobs.stop,
            "delete": self.jobs.delete,
            "wait": self.jobs.wait,
            "close": self.jobs.close,
        }
        return StandInEndpoint(calls.get(endpoint, self._refuse))


@dataclass(frozen=True)
class ContextHooks:
    """What AllocationRecovery and HostRecovery need of the cluster context whose jobs they recover, handed them:
    the context's state stays its own, read and changed only through these."""

    hostset: HostSet | None  # the cluster's hosts: their addresses and names become the next run's
    roots: list[str]  # each job runner's root (the same in each run; shared with the driver where shared_roots)
    runners: Callable[[], list[Any]]  # the job runners now
    names: Callable[[], list[str]]  # their lifeline names
    where: Callable[[], dict[str, int]]  # a copy of each job's runner index (taken under the context's lock)
    generation: Callable[[], int]  # how many times the context's runners were started or replaced
    job_spec: Callable[[], str]  # the jobs' FRAY_BACKEND now
    set_job_spec: Callable[[str], None]
    spawn_runners: Callable[[list[Any]], None]  # a job runner on each host of the allocation's next run
    runners_ended: Callable[[list[Any]], None]  # the hosts are gone for good: these stand-ins answer for them
    shared_roots: bool  # the roots are on storage the driver shares with the hosts
    gone: Callable[[], set[str]]  # the lifeline names of the runners whose lifeline closed
    # A runner's host is lost: the stand-in answers for it, new jobs go to the live runners, jobs moved run there.
    retire: Callable[[int, Any, list[int], dict[str, int]], None]


class AllocationRecovery:
    """Recovers a MonarchClusterContext's jobs from a preemption of its Slurm allocation (the module docstring)."""

    def __init__(
        self,
        allocation: Any,
        preempt_wait: float,
        driver_bind: str,
        respec: Callable[[HostSet], str] | None,
        host: ContextHooks,
        lost_host: Callable[[str, Callable[[str], tuple[JobInfo | None, Submitted | None, str]]], None],
    ) -> None:
        self._allocation = allocation  # slurm_alloc.SlurmAllocation, or None: nothing to recover from
        self._preempt_wait = preempt_wait
        self._bind = driver_bind
        self._respec = respec  # HostSet -> the jobs' FRAY_BACKEND (cluster.context.job_spec)
        self._host = host
        self._lost_host = lost_host  # one host lost while the others run on (host_recovery.HostRecovery.recover)
        self._pending: set[str] = set()  # lifelines closed, not looked into yet
        self._tails: dict[str, str] = {}  # the end of each job's log the context last read that held its record
        self._idle = threading.Condition()
        self._recovering = False
        self._closing = False
        self._seen: dict[str, JobInfo] = {}
        self._submitted: dict[str, Submitted] = {}

    @property
    def allocation(self) -> Any:
        """The Slurm allocation holding the hosts (None: nothing to recover from)."""
        return self._allocation

    @property
    def recovering(self) -> bool:
        """Whether the jobs' hosts are being looked into or brought back now."""
        return self._recovering

    def close(self) -> None:
        """The context is shutting down: a lost runner is no longer looked into."""
        self._closing = True

    def lifeline_lost(self, name: str) -> None:
        """A job runner's lifeline closed: its host or process is gone. A preemption of the Slurm allocation
        holding every host, or else the loss of that one host, is looked into (on a thread of its own)."""
        if self._closing or name not in self._host.names():
            return
        with self._idle:
            self._pending.add(name)
            if self._recovering:
                return  # (the thread under way looks into it next)
            self._recovering = True
        threading.Thread(target=self._recover, name="fray-monarch-recovery", daemon=True).start()

    def settle(self, within: float | None = None) -> None:
        """Wait out a recovery under way (bounded by its own waits, and by `within` s where given)."""
        limit = (HOST_WAIT if self._allocation is None else self._preempt_wait + ATTACH_WAIT) + 60.0
        with self._idle:
            self._idle.wait_for(lambda: not self._recovering, limit if within is None else min(within, limit))

    def saw(self, info: JobInfo) -> JobInfo:
        """A job as the context last saw it (how it ended, if its hosts go after it did)."""
        self._seen[info.id] = info
        return info

    def saw_log(self, job_id: str, log_end: str) -> str:
        """The end of a job's raw log as the context last read it (its record, if its host goes with its log)."""
        if has_record(log_end):
            self._tails[job_id] = log_end
        return log_end

    def remember(self, job_id: str, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str | None) -> None:
        """What a job was started with, to start it again."""
        self._submitted[job_id] = Submitted(entrypoint, env, working_dir)

    def _last_seen(self, job_id: str) -> tuple[JobInfo | None, Submitted | None, str]:
        return self._seen.get(job_id), self._submitted.get(job_id), self._tails.get(job_id, "")

    def _recover(self) -> None:
        taken = False
        try:
            taken = self._allocation is not None and self._allocation_taken()
            while not taken and not self._closing:
                with self._idle:
                    if not self._pending:
                        break
                    name = self._pending.pop()
                try:
                    self._lost_host(name, self._last_seen)
                except Exception:
                    log.exception("fray: running again the jobs of a lost host failed")
        except Exception:
            log.exception("fray: recovering the jobs of a preempted Slurm allocation failed")
        finally:
            with self._idle:
                if taken or self._closing:
                    self._pending.clear()
                again = self._recovering = bool(self._pending)  # (a lifeline that closed meanwhile)
                self._idle.notify_all()
            if again:
                threading.Thread(target=self._recover, name="fray-monarch-recovery", daemon=True).start()

    def _allocation_taken(self) -> bool:
        """Whether Slurm took the allocation (then its jobs were recovered from that), else one host was lost."""
        allocation = self._allocation
        assert allocation is not None
        start = time.monotonic()
        while (taken := allocation.taken()) is None and not self._closing:
            waited = time.monotonic() - start
            if waited > ENDING_WITHIN or (waited > TAKEN_WITHIN and not allocation.ending()):
                break
            time.sleep(0.5)
        if taken is None or self._closing:
            return self._closing
        self._recover_from(*taken)
        return True

    def _recover_from(self, reason: str, requeued: bool) -> None:
        allocation = self._allocation
        assert allocation is not None
        lost_at = time.time()
        where = self._host.where()
        log.warning("fray: %s; its jobs' hosts are gone", reason)
        try:
            if not requeued:
                raise FrayError("its jobs are not run again")
            names = allocation.wait_requeued(self._preempt_wait)
            addresses = allocation.addresses(ATTACH_WAIT)
            mesh = network.attach(addresses, ATTACH_WAIT, self._bind, name=f"fray_hosts_{self._host.generation() + 1}")
        except Exception as exc:
            self._end_lost(where, f"{reason}; {exc}", lost_at)
            return
        hostset = self._host.hostset
        assert hostset is not None  # (the allocation is the hostset's)
        hostset.addresses, hostset.names = addresses, names
        before = self._host.job_spec()
        if self._respec is not None:
            self._host.set_job_spec(self._respec(hostset))
        self._host.spawn_runners([mesh.slice(hosts=i) for i in range(int(mesh.size("hosts")))])
        for job_id, index in where.items():
            try:
                self._resume(job_id, index % len(self._host.runners()), reason, lost_at, before)
            except Exception as exc:
                log.warning("fray: job %s could not be run again after %s: %s", job_id, reason, exc)

    def _tail(self, index: int, job_id: str) -> str:
        """The end of the job's log from its last record on (the log is on storage that outlived its host)."""
        try:
            return record_tail(self._host.roots[index], job_id)
        except OSError:
            return ""

    def _ended_info(self, job_id: str, index: int) -> JobInfo | None:
        """The job as it ended before its hosts went, if it had ended: as last seen, else from its final record."""
        seen = self._seen.get(job_id)
        if seen is not None and seen.status.is_terminal:
            return seen
        final = final_state(self._tail(index, job_id))
        if final is None:
            return None
        status, last = final
        return replace(self._lost_info(job_id, ""), status=status, end_time=last.end_time, exit_code=last.exit_code)

    def _lost_info(self, job_id: str, message: str) -> JobInfo:
        seen = self._seen.get(job_id)
        submitted = self._submitted.get(job_id)
        text = "" if submitted is None else submitted.command
        info = seen or JobInfo(job_id, JobStatus.RUNNING, entrypoint=text)
        return replace(info, status=JobStatus.FAILED, end_time=time.time(), message=message)

    def _resume(self, job_id: str, index: int, reason: str, lost_at: float, old_spec: str) -> None:
        """Start the job again on runner `index` (the runner that ran it, in the allocation's next run); old_spec:
        the jobs' FRAY_BACKEND before (a job's own is kept)."""
        runner = self._host.runners()[index]
        ended = self._ended_info(job_id, index)
        submitted = self._submitted.get(job_id)
        if ended is None and submitted is not None and is_supervised(submitted.command):
            seen = self._seen.get(job_id)
            started = seen.start_time or seen.submission_time if seen is not None else None
            specs = (old_spec, self._host.job_spec())  # (the next run's hosts are on other nodes)
            env = submitted.env_to_run_again(self._tail(index, job_id), reason, started, lost_at, specs)
            again = runner.resume.call_one(submitted.entrypoint, env, job_id, submitted.working_dir, "")  # (log kept)
            _unwrap(again.get(timeout=60))
            return
        info = ended or self._lost_info(job_id, f"lost: {reason} (a plain command is not run again)")
        _unwrap(runner.adopt.call_one(info).get(timeout=60))

    def _end_lost(self, where: dict[str, int], why: str, lost_at: float) -> None:
        """The allocation is not coming back: each job that had not ended ends FAILED, answered for by a stand-in
        of its runner in the driver."""
        log.warning("fray: %s", why)
        roots = self._host.roots
        runners = [_EndedRunner(root, why) for root in roots]
        for job_id, index in where.items():
            info = self._ended_info(job_id, index)
            if info is None:
                info = self._lost_info(job_id, f"lost: {why}")
                submitted = self._submitted.get(job_id)
                if submitted is not None and is_supervised(submitted.command):
                    seen = self._seen.get(job_id)
                    started = seen.start_time if seen is not None else None
                    ending, message = lost_for_good(self._tail(index, job_id), why, started, lost_at)
                    _append(Path(roots[index]) / job_id / "log", ending)
                    info = replace(info, message=message)
            try:
                runners[index].jobs.adopt(info)
            except (OSError, FrayError) as exc:  # its directory did not outlive its host: not on shared storage
                log.warning("fray: job %s: %s", job_id, exc)
        self._host.runners_ended(list(runners))


def _unwrap(reply: Any) -> Any:
    return reply.unwrap()


def _append(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
