"""How one attempt of a supervised job ended (its JobAttempt), and whether the job runs another (fray.jobs.policy
says what the outcomes and budgets mean)."""

from __future__ import annotations

from dataclasses import dataclass

from fray.jobs.call import CallOutcome
from fray.jobs.local import ended_status
from fray.jobs.policy import JobPolicy, is_preemption_code
from fray.jobs.signals import StopRequest
from fray.types import JobAttempt, JobError, JobStatus

__all__ = ["AttemptEnd", "judge", "next_step"]


@dataclass(frozen=True)
class AttemptEnd:
    """What the supervisor saw of an attempt: the rank that ended it first (None: none failed) with its exit code
    (None: its node was lost), the stop or preemption it got, how long its ranks took after SIGTERM, and the
    callables' outcomes by rank."""

    number: int
    start: float
    end: float
    replicas: int
    failed: int | None = None
    code: int | None = None
    node_lost: str | None = None  # why a rank's node or host is gone
    request: StopRequest | None = None
    grace: float | None = None  # seconds from the ranks' SIGTERM to their end (or SIGKILL)
    killed: bool = False  # a rank was still running at the end of the grace period
    outcomes: dict[int, CallOutcome] | None = None


def judge(end: AttemptEnd) -> tuple[JobAttempt, JobError | None, CallOutcome | None]:
    """The attempt's record, its callable's error (if one raised) and rank 0's outcome (if it succeeded)."""
    outcomes = end.outcomes or {}
    after = ""
    if end.grace is not None:
        after = f"; its ranks had {end.grace:.1f} s after SIGTERM" + (", then SIGKILL" if end.killed else "")

    def attempt(status: JobStatus, outcome: str, code: int | None, message: str) -> JobAttempt:
        text = message + after
        return JobAttempt(end.number, status, code, end.start, end.end, text, outcome, end.grace, end.replicas)

    who = f"rank {end.failed}" if end.replicas > 1 else "it"
    if end.request is not None and not end.request.preempted:
        return attempt(JobStatus.STOPPED, "stopped", None, "stopped by request"), None, None
    if end.request is not None:
        return attempt(JobStatus.FAILED, "lost", None, end.request.reason), None, None
    if end.node_lost is not None:
        return attempt(JobStatus.FAILED, "lost", None, f"lost: {who}'s node: {end.node_lost}"), None, None
    if end.failed is None or end.code is None:
        return attempt(JobStatus.SUCCEEDED, "succeeded", 0, ""), None, outcomes.get(0)
    if is_preemption_code(end.code):
        return attempt(JobStatus.FAILED, "lost", end.code, f"preempted: {who} got SIGTERM"), None, None
    message = f"{who} {ended_status(end.code)[2]}"
    error = None
    raised = outcomes.get(end.failed)
    if raised is not None and raised.error is not None:
        error = raised.error
        message = f"{who} raised {error.type}: {error.message}"
    return attempt(JobStatus.FAILED, "failed", end.code, message), error, None


def next_step(policy: JobPolicy, attempts: list[JobAttempt]) -> str | None:
    """None: run another attempt; else why the job ends now (the last attempt says how)."""
    last = attempts[-1]
    if last.outcome in ("succeeded", "stopped"):
        return last.outcome
    if last.outcome == "lost":
        lost = sum(a.outcome == "lost" for a in attempts)
        return (
            None if lost <= policy.max_recoveries else f"{lost} lost attempts (max_recoveries={policy.max_recoveries})"
        )
    failures = sum(a.outcome == "failed" for a in attempts)
    if not policy.retries(last.exit_code):
        return f"exit code {last.exit_code} is not retried"
    return None if failures <= policy.max_retries else f"{failures} failed attempts (max_retries={policy.max_retries})"
