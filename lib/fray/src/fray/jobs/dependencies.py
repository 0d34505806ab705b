"""Jobs that wait for others: `create_job(..., after=[...])`.

A job submitted with `after` is recorded here at once, PENDING, with the ids it waits for on its record
(`JobInfo.waiting_for`), and handed to the backend (the submit callable, with its id) only once every one of them
has SUCCEEDED. One that FAILED, was STOPPED or is gone (deleted) ends it FAILED without running, its message naming
that job and how it ended. The wait is kept by the context that submitted it (a watcher thread polls the jobs it waits
for), so it lives as long as that context: `stop_job` of the waiting job ends it STOPPED, and the context's shutdown
ends every wait it holds. A job that started is the backend's; one that ended without starting stays here, listed,
until it is deleted. Where the context's cluster says where it is (`describe()`), what it holds is published on the
cluster's board (fray.jobs.wait_board) for the other processes of its user on its host, which list it, follow it and
ask its holder to stop it.
"""

from __future__ import annotations

import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from fray.errors import FrayError, GetTimeoutError, JobExistsError, JobNotFoundError, UnsupportedFeatureError
from fray.jobs.requests import name_of
from fray.jobs.wait_board import Board
from fray.types import JobInfo, JobStatus

__all__ = ["Waits", "waits_of"]

POLL_S = 0.2  # how often the watcher reads the state of the jobs a waiting job waits for
UNREADABLE_S = 60.0  # a job whose state cannot be read this long ends the jobs waiting for it FAILED
STOP_ASKED_S = 10.0  # how long a stop of a job another process holds waits for that process to stop it
_SHOWN = 200  # the characters of a failed dependency's message kept in the waiting job's message
_MADE = threading.Lock()  # (one for every context: each makes its Waits once)


@dataclass
class _Waiting:
    info: JobInfo
    start: Callable[[str], str]  # submits the job to the backend under its id
    starting: bool = False
    unreadable_since: float | None = None


class Waits:
    """The jobs one context holds back until the jobs they wait for succeed. `lookup` reads a job's state from
    the backend (JobNotFoundError if it is gone); `explain` adds what its record says (its message); `board`, where
    the context's cluster has one, is where its held jobs are published for other processes (fray.jobs.wait_board)
    and where theirs are read."""

    def __init__(
        self, lookup: Callable[[str], JobInfo], explain: Callable[[JobInfo], JobInfo], board: Board | None = None
    ) -> None:
        self._lookup = lookup
        self._explain = explain
        self._board = board
        self._cond = threading.Condition()
        self._jobs: dict[str, _Waiting] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------------ submitting
    def targets(
        self, after: Sequence[str] | None, detached: bool, backend: str, resolve: Callable[[str], str]
    ) -> tuple[str, ...]:
        """The ids of the jobs `after` names (each a JobHandle, an id or a name: its latest run)."""
        if after is None:
            return ()
        if isinstance(after, str) or not isinstance(after, Sequence):
            raise TypeError(f"after must be a list of jobs (handles, ids or names), got {after!r}")
        for job in after:
            if not isinstance(job, str):
                raise TypeError(f"after names jobs by handle, id or name (a str), got {type(job).__name__}")
        if after and detached:
            raise UnsupportedFeatureError(
                "job dependencies",
                backend,
                "a detached job cannot wait for others (after=): the wait is kept by the submitting process, which "
                "a detached job outlives; wait for them yourself (fray.wait_jobs), then submit it detached",
            )
        try:
            return tuple(dict.fromkeys(resolve(job) for job in after))
        except JobNotFoundError as exc:
            raise JobNotFoundError(f"after= names a job that is not there: {exc}") from None

    def deferring(
        self, submit: Callable[[str | None], str], after: tuple[str, ...], entrypoint: str | list[str]
    ) -> Callable[[str | None], str]:
        """A submit callable that records the job as waiting for `after` and returns its id at once."""
        text = entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint)

        def defer(job_id: str | None) -> str:
            job_id = job_id or f"job-{uuid.uuid4().hex[:12]}"
            try:
                self._lookup(job_id)
            except JobNotFoundError:
                pass
            else:
                raise JobExistsError(f"a job with id {job_id!r} exists")
            waits = ", ".join(after)
            named = name_of(job_id)
            info = JobInfo(job_id, JobStatus.PENDING, time.time(), entrypoint=text, message=f"waits for {waits}")
            info = replace(info, name=named[0] if named else None, waiting_for=after)
            with self._cond:
                if self._closed:
                    raise FrayError("this cluster context is shut down: it starts no job")
                if job_id in self._jobs:
                    raise JobExistsError(f"a job with id {job_id!r} exists")
                self._jobs[job_id] = _Waiting(info, submit)
                self._publish(info)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, name="fray-job-waits", daemon=True)
                    self._thread.start()
                self._cond.notify_all()
            return job_id

        return defer

    # ------------------------------------------------------------------ the verbs, for a job held here or elsewhere
    def info(self, job_id: str) -> JobInfo | None:
        """The record of a job held here or by another process (waiting, or ended without starting); None for any
        other."""
        with self._cond:
            held = self._jobs.get(job_id)
            if held is not None:
                return held.info
        other = self._board.other(job_id) if self._board is not None else None
        return None if other is None else other[0]

    def merged(self, listed: list[JobInfo]) -> list[JobInfo]:
        """The backend's list and, after it, the jobs held here and by other processes."""
        seen = {info.id for info in listed}
        with self._cond:
            held = [w.info for w in self._jobs.values()]
        held += self._board.others() if self._board is not None else []
        fresh = {info.id: info for info in held if info.id not in seen}
        return listed + sorted(fresh.values(), key=lambda info: info.submission_time or 0.0)

    def stop(self, job_id: str) -> bool:
        """Stop a job held here or by another process: True if it was (it ends STOPPED, or had ended), False if it
        is the backend's."""
        with self._cond:
            while job_id in self._jobs and self._jobs[job_id].starting:
                self._cond.wait(0.5)  # handed to the backend now: that call is bounded by the backend's
            held = self._jobs.get(job_id)
            if held is not None:
                if not held.info.status.is_terminal:
                    self._end(held, JobStatus.STOPPED, f"stopped before it started (it waited for {self._of(held)})")
                return True
        return self._stop_other(job_id)

    def _stop_other(self, job_id: str) -> bool:
        other = self._board.other(job_id) if self._board is not None else None
        if self._board is None or other is None:
            return False
        if not other[0].status.is_terminal:
            self._board.ask_stop(job_id)
        deadline = time.monotonic() + STOP_ASKED_S
        while other is not None and not other[0].status.is_terminal:
            if time.monotonic() >= deadline:
                raise FrayError(
                    f"job {job_id} waits in process {other[1]} on this host, which submitted it, and it did not stop "
                    f"it within {STOP_ASKED_S:.0f} s: stop it there"
                )
            time.sleep(POLL_S)
            other = self._board.other(job_id)
        if other is not None:
            return True
        try:  # gone from the board: started meanwhile (the backend's to stop), or its holder ended with it
            self._lookup(job_id)
        except JobNotFoundError:
            return True
        return False

    def delete(self, job_id: str) -> bool:
        """Forget a job held here (True: the jobs waiting for it see it gone), or say it is the backend's (False).
        A job another process holds is that process's to delete (FrayError)."""
        with self._cond:
            while job_id in self._jobs and self._jobs[job_id].starting:
                self._cond.wait(0.5)
            if self._jobs.pop(job_id, None) is not None:
                self._withdraw(job_id)
                self._cond.notify_all()
                return True
        other = self._board.other(job_id) if self._board is not None else None
        if other is None:
            return False
        raise FrayError(
            f"job {job_id} waits in process {other[1]} on this host, which submitted it: delete it there (stop_job "
            "works from here)"
        )

    def wait(self, job_id: str, timeout: float | None) -> tuple[JobInfo | None, float | None]:
        """Block while the job waits (held here or by another process): its record once it ended without starting,
        or (None, the timeout left) once it is the backend's (or never waited). GetTimeoutError after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.info(job_id)
            left = None if deadline is None else deadline - time.monotonic()
            if info is None:
                return None, None if left is None else max(left, 0.0)
            if info.status.is_terminal:
                return info, left
            if left is not None and left <= 0:
                waits = ", ".join(info.waiting_for)
                raise GetTimeoutError(
                    f"job {job_id} did not end within {timeout} s (status PENDING: it waits for {waits})"
                )
            with self._cond:  # (a job held here is told of at once; one held elsewhere is read again)
                self._cond.wait(POLL_S if left is None else min(left, POLL_S))

    def tail(self, job_id: str, follow: Callable[[str], Iterator[str]]) -> Iterator[str]:
        """The job's output: nothing while it waits, then the backend's, once it started."""
        ended, _ = self.wait(job_id, None)
        if ended is None:
            yield from follow(job_id)

    def close(self, timeout: float = 30.0) -> None:
        """End every wait (the jobs end STOPPED); a job being handed to the backend is let finish (the backend's
        shutdown, which follows, ends it). Idempotent."""
        with self._cond:
            self._closed = True
            for held in self._jobs.values():
                if not held.info.status.is_terminal and not held.starting:
                    self._end(held, JobStatus.STOPPED, "not started: its cluster context shut down while it waited")
                self._withdraw(held.info.id)  # (what this process held is gone for the others with it)
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------ the watcher
    def _watch(self) -> None:
        while True:
            with self._cond:
                waiting = [w for w in self._jobs.values() if not w.info.status.is_terminal and not w.starting]
                if self._closed or not waiting:
                    self._thread = None
                    return
            for held in waiting:
                if self._board is not None and self._board.stop_asked(held.info.id):
                    self._ended(held, JobStatus.STOPPED, f"stopped before it started (it waited for {self._of(held)})")
                    continue
                self._judge(held)
            with self._cond:
                self._cond.wait(POLL_S)

    def _judge(self, held: _Waiting) -> None:
        """Start the job if every job it waits for succeeded; end it if one did not; else leave it waiting."""
        for target in held.info.waiting_for:
            state = self._state_of(held, target)
            if state is None:
                return  # unreadable for now, or gone (which ended it)
            if state.status is JobStatus.SUCCEEDED:
                continue
            if state.status.is_terminal:
                how = self._how(state)
                self._ended(held, JobStatus.FAILED, f"not started: job {target}, which it waits for, ended {how}")
            return  # ended it, or it is still pending or running
        with self._cond:
            if held.info.status.is_terminal or self._closed:
                return
            held.starting = True
        try:
            held.start(held.info.id)
        except Exception as exc:
            with self._cond:
                held.starting = False
                message = f"not started: the jobs it waited for succeeded, but it could not be submitted: {exc}"
                self._end(held, JobStatus.FAILED, message)
            return
        with self._cond:
            self._jobs.pop(held.info.id, None)  # the backend's now (it lists it from here on)
            self._withdraw(held.info.id)
            self._cond.notify_all()

    def _state_of(self, held: _Waiting, target: str) -> JobInfo | None:
        with self._cond:
            other = self._jobs.get(target)
            if other is not None:
                return None if other.starting else other.info  # (starting: the backend may not list it yet)
        try:
            state = self._lookup(target)
        except JobNotFoundError:
            self._ended(held, JobStatus.FAILED, f"not started: job {target}, which it waits for, was deleted")
            return None
        except Exception as exc:
            now = time.monotonic()
            held.unreadable_since = held.unreadable_since or now
            if now - held.unreadable_since >= UNREADABLE_S:
                message = f"not started: the state of job {target}, which it waits for, could not be read: {exc}"
                self._ended(held, JobStatus.FAILED, message)
            return None
        held.unreadable_since = None
        return state

    def _how(self, state: JobInfo) -> str:
        try:
            state = self._explain(state)
        except Exception:  # what its record says is a detail: the status is the answer
            pass
        how = state.status.value
        detail = f"{state.error.type}: {state.error.message}" if state.error is not None else state.message
        if detail:
            return f"{how}: {detail[:_SHOWN]}" + ("..." if len(detail) > _SHOWN else "")
        return how if state.exit_code is None else f"{how} (exit code {state.exit_code})"

    def _ended(self, held: _Waiting, status: JobStatus, message: str) -> None:
        with self._cond:
            if not held.info.status.is_terminal:
                self._end(held, status, message)

    def _end(self, held: _Waiting, status: JobStatus, message: str) -> None:
        """(with the lock held)"""
        held.info = replace(held.info, status=status, end_time=time.time(), message=message)
        self._publish(held.info)
        self._cond.notify_all()

    def _publish(self, info: JobInfo) -> None:
        if self._board is not None:
            self._board.publish(info)

    def _withdraw(self, job_id: str) -> None:
        if self._board is not None:
            self._board.withdraw(job_id)

    @staticmethod
    def _of(held: _Waiting) -> str:
        return ", ".join(held.info.waiting_for)


def waits_of(
    owner: object,
    lookup: Callable[[str], JobInfo],
    explain: Callable[[JobInfo], JobInfo],
    backend: str,
    where: Callable[[], dict[str, str]],
) -> Waits:
    """The Waits of a context, made on first use (a context's backend may not call the base class's __init__).
    `where` says where its cluster is (ClusterContext.describe): a cluster that says nothing (its jobs live in
    one process) has no board."""
    waits = getattr(owner, "_job_waits", None)
    if waits is None:
        with _MADE:
            waits = getattr(owner, "_job_waits", None)
            if waits is None:
                place = where()
                waits = Waits(lookup, explain, Board(backend, place) if place else None)
                owner._job_waits = waits  # type: ignore[attr-defined]
    assert isinstance(waits, Waits)
    return waits
