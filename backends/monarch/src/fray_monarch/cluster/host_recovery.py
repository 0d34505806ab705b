"""A monarch cluster's jobs after one of its hosts was lost while the others run on (not every host of a Slurm
allocation at once: job_recovery.py). When the lifeline of a host's job runner closes, its host worker's address is
probed as the context's placement probes a host (twice, PROBE_AGAIN apart); where nothing answers, the host is
lost, and each job its runner held that had not ended:

- a supervised one runs again on the runner of a live host (in turn), under the same id, the attempt that ran
  `lost` ("lost: the job's host NAME was lost", FRAY_JOB_RECOVERY: fray.jobs.recovery). Where the runners' roots are
  on storage the driver shares with the hosts (a Slurm allocation's), the job's directory moves to the new runner's
  root and its log goes on; else its log went with the host (a runner's root is a private directory in its host's
  /tmp), and the new log starts with a line saying so, its record the attempts as the driver last read them;
- a plain command ends FAILED, its message naming the host (it has no record to go on from);
- with no live host left, a supervised one ends FAILED too, its record's last attempt `lost`, saying so.

A stand-in of the lost runner in the driver answers for the jobs that stay with it: those that had ended (as the
driver last saw them) and those not run again."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fray.backend import (
    JobInfo,
    JobStatus,
    LocalJobs,
    RuntimeEnv,
    is_supervised,
    lost_for_good,
)
from fray.errors import FrayError, JobNotFoundError
from fray_monarch.cluster.job_recovery import ContextHooks, StandInEndpoint, Submitted, final_state, record_tail
from fray_monarch.net import network

__all__ = ["HostRecovery", "LastSeen", "LostRunner", "answer", "start_again"]

log = logging.getLogger("fray_monarch")

PROBE_AGAIN = 0.3  # seconds between the two probes that say a host still answers (as the placement's)
RESUME_WAIT = 60.0  # seconds a live host's runner has to start a job again
ANSWER_WAIT = 30.0  # seconds a job runner has to answer about a job (as the context's MARGIN)

# job id -> the job as the driver last saw it, what it was started with, the end of its log it last read
LastSeen = Callable[[str], tuple[JobInfo | None, Submitted | None, str]]


def start_again(
    jobs: LocalJobs, entrypoint: str | list[str], env: RuntimeEnv, job_id: str, working_dir: str | None, first_line: str
) -> str:
    """(On a job runner.) Start again a job whose hosts were lost: its directory and log are under this runner's
    root already (moved there on shared storage), or, with a `first_line`, its log went with its host: a new
    directory (0700) and log (0600) are made, the log starting with that line."""
    if first_line:
        job_dir = jobs.root / job_id
        job_dir.mkdir(mode=0o700)  # (FileExistsError where it has one here)
        fd = os.open(job_dir / "log", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, first_line.encode())
        finally:
            os.close(fd)
    return jobs.start(entrypoint, env, job_id, False, working_dir, resume=True)


def answer(
    runner_of: Callable[[str], Any],
    job_id: str,
    endpoint: str,
    args: tuple[Any, ...],
    now: Callable[[], tuple[int, bool]],
) -> Any:
    """The answer of a job's runner (`runner_of(job_id)`) at `endpoint`. `now()`: the context's runner generation,
    and whether a recovery is under way. Where the generation changed or a recovery began meanwhile (the job's host
    was lost: it may run elsewhere now), it is asked again, of its runner then, rather than waiting ANSWER_WAIT s
    for a host that is gone."""
    while True:
        generation = now()[0]
        future = getattr(runner_of(job_id), endpoint).call_one(job_id, *args)
        deadline = time.monotonic() + ANSWER_WAIT
        while True:
            try:
                return future.get(timeout=1.0).unwrap()
            except TimeoutError:
                current, recovering = now()
                if recovering or current != generation:
                    break
                if time.monotonic() > deadline:
                    raise


class LostRunner:
    """A lost host's job runner's stand-in in the driver: it answers for the jobs that stay with it (the endpoints
    the context calls), from what the driver kept of them."""

    def __init__(self, why: str) -> None:
        self.why = why
        self.kept: dict[str, tuple[JobInfo, str]] = {}  # job id -> its info, its log

    def _job(self, job_id: str) -> tuple[JobInfo, str]:
        if job_id not in self.kept:
            raise JobNotFoundError(f"no job {job_id!r} here (it never existed or was deleted)")
        return self.kept[job_id]

    def _refuse(self, *args: Any) -> Any:
        raise FrayError(f"{self.why}: its job runner runs no more jobs")

    def _log_end(self, job_id: str, lines: int) -> str:
        return "".join(self._job(job_id)[1].splitlines(keepends=True)[-lines:]) if lines > 0 else ""

    def __getattr__(self, endpoint: str) -> StandInEndpoint:
        calls: dict[str, Callable[..., Any]] = {
            "info": lambda job_id: self._job(job_id)[0],
            "list": lambda: [info for info, _ in self.kept.values()],
            "logs": lambda job_id: self._job(job_id)[1],
            "log_end": self._log_end,
            "stop_job": lambda job_id: self._job(job_id) and None,
            "delete": lambda job_id: self.kept.pop(self._job(job_id)[0].id) and None,
            "wait": lambda job_id, timeout: self._job(job_id)[0],
            "close": lambda: None,
        }
        return StandInEndpoint(calls.get(endpoint, self._refuse))


class HostRecovery:
    """Runs again elsewhere the jobs of a MonarchClusterContext's host that was lost (the module docstring)."""

    def __init__(self, host: ContextHooks, respec: Callable[[Any], str] | None) -> None:
        self._host = host
        self._respec = respec  # HostSet -> the jobs' FRAY_BACKEND (cluster.context.job_spec)

    def recover(self, name: str, last_seen: LastSeen) -> None:
        """The lifeline `name` of a job runner closed: if its host no longer answers, its jobs go on elsewhere."""
        names, hostset = self._host.names(), self._host.hostset
        if name not in names or hostset is None:
            return
        index = names.index(name)
        address = hostset.addresses[index] if index < len(hostset.addresses) else ""
        why = _silent(address) if address else None
        if why is None:  # its host answers: only the runner's process ended (its jobs with it, as their owner)
            return
        lost_at = time.time()
        host_name = hostset.names[index] if index < len(hostset.names) else address
        gone = self._host.gone()
        live = [i for i, other in enumerate(names) if i != index and other not in gone]
        log.warning("fray: host %s is lost (%s); its jobs run again on the hosts left (%d)", host_name, why, len(live))
        before = spec = self._host.job_spec()
        if live and self._respec is not None:  # (a job's own fray context must not attach to the lost host)
            left = [i for i in live if i < len(hostset.addresses)]
            named = [hostset.names[i] if i < len(hostset.names) else hostset.addresses[i] for i in left]
            spec = self._respec(replace(hostset, addresses=[hostset.addresses[i] for i in left], names=named))
            self._host.set_job_spec(spec)
        stand_in = LostRunner(f"host {host_name} is lost ({why})")
        runners, moved = self._host.runners(), dict[str, int]()
        for job_id in [job_id for job_id, at in self._host.where().items() if at == index]:
            seen, submitted, tail = last_seen(job_id)
            tail = self._moved_tail(index, job_id, tail)
            reason = f"the job's host {host_name} was lost"
            ended = _ended(seen, tail)
            target = live[len(moved) % len(live)] if live else None
            if ended is None and target is not None and submitted is not None and is_supervised(submitted.command):
                try:
                    self._run_again(
                        job_id, (index, target), runners[target], submitted, seen, tail, reason, lost_at, before
                    )
                    moved[job_id] = target
                    continue
                except Exception as exc:
                    log.warning("fray: job %s could not be run again after its host was lost: %s", job_id, exc)
                    reason += f"; it could not be run again: {exc}"
            elif ended is None and target is None:
                reason += "; no live host is left to run it again"
            stand_in.kept[job_id] = self._kept(job_id, index, host_name, seen, submitted, tail, ended, reason, lost_at)
        self._host.retire(index, stand_in, live, moved)

    def _moved_tail(self, index: int, job_id: str, seen_tail: str) -> str:
        """The end of the job's log from its record on: read from its log where that outlived its host (the roots
        are on shared storage), else as the driver last read it."""
        if not self._host.shared_roots:
            return seen_tail
        try:
            return record_tail(self._host.roots[index], job_id)
        except OSError:
            return seen_tail

    def _run_again(
        self,
        job_id: str,
        moves: tuple[int, int],
        runner: Any,
        submitted: Submitted,
        seen: JobInfo | None,
        tail: str,
        reason: str,
        lost_at: float,
        before: str,
    ) -> None:
        """Start the job again on `runner`, moving it from runner moves[0] to moves[1]; before: the jobs'
        FRAY_BACKEND before the host was lost (a job's own is kept)."""
        index, target = moves
        started = (seen.start_time or seen.submission_time) if seen is not None else None
        specs = (before, self._host.job_spec())  # (the cluster's hosts less the lost one)
        env = submitted.env_to_run_again(tail, reason, started, lost_at, specs)
        first_line = f"[fray] the output of this job's attempts before this one was lost with its host: {reason}\n"
        if self._host.shared_roots:  # its directory and log go on under the new runner's root
            os.rename(Path(self._host.roots[index]) / job_id, Path(self._host.roots[target]) / job_id)
            first_line = ""
        answer = runner.resume.call_one(submitted.entrypoint, env, job_id, submitted.working_dir, first_line)
        answer.get(timeout=RESUME_WAIT).unwrap()

    def _kept(
        self,
        job_id: str,
        index: int,
        host_name: str,
        seen: JobInfo | None,
        submitted: Submitted | None,
        tail: str,
        ended: JobInfo | None,
        reason: str,
        lost_at: float,
    ) -> tuple[JobInfo, str]:
        """What the stand-in answers for a job not run again: its info and its log."""
        text = submitted.command if submitted is not None else ""
        path = Path(self._host.roots[index]) / job_id / "log"
        try:
            log_text = path.read_text(errors="replace") if self._host.shared_roots else ""
        except OSError:
            log_text = ""
        if not log_text:
            log_text = f"[fray] this job's log was lost with its host {host_name}" + (
                "; its end as this driver last read it:\n" + tail if tail else "\n"
            )
        if ended is not None:
            return ended, log_text
        info = seen or JobInfo(job_id, JobStatus.RUNNING, submission_time=lost_at, entrypoint=text)
        if submitted is not None and is_supervised(text):
            started = seen.start_time if seen is not None else None
            ending, message = lost_for_good(tail, reason, started, lost_at)
            log_text += ending
        else:
            message = f"lost: {reason} (a plain command is not run again)"
            log_text += f"[fray] the job ends: {message}\n"
        return replace(info, status=JobStatus.FAILED, end_time=lost_at, message=message), log_text


def _ended(seen: JobInfo | None, tail: str) -> JobInfo | None:
    """The job as it ended before its host went, if it had ended: as last seen, else from its final record."""
    if seen is not None and seen.status.is_terminal:
        return seen
    final = final_state(tail)
    if seen is None or final is None:
        return None
    status, last = final
    return replace(seen, status=status, end_time=last.end_time, exit_code=last.exit_code, message=last.message)


def _silent(address: str) -> str | None:
    """Why nothing answers at a host worker's address (asked twice: a host worker killed with its processes may
    still accept for a moment), or None if it answers."""
    why = network.why_silent(address)
    if why is None:
        time.sleep(PROBE_AGAIN)
        why = network.why_silent(address)
    return why
