"""How a supervised job's attempts are judged and budgeted, and how long a rank has between SIGTERM and SIGKILL.

An attempt ends as one of four outcomes (JobAttempt.outcome):

- "succeeded": every rank exited 0;
- "failed": a rank exited non-zero, was killed by a signal other than a preemption's, or its callable raised;
- "lost": it was preempted (a rank, or the job's supervisor, got SIGTERM that fray's own stop did not send: a
  scheduler's, a Slurm preemption's, a host going down) or a rank's node or host died under it;
- "stopped": the job was stopped (stop_job, delete_job, `fray job stop`, Ctrl-C of an attached submit).

`max_retries` counts failed attempts; `max_recoveries` counts lost ones; a stopped job is never run again.
`retry_on_exit_codes` (retry only those) or `no_retry_on_exit_codes` (never retry those) refine which failures are
retried; a rank killed by signal N has exit code 128 + N there, as a shell reports it.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

from fray.host import settings

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_RECOVERIES",
    "GRACE_VAR",
    "KILL_MARGIN",
    "OUTCOMES",
    "OWNER_SIGNALS_ALL_VAR",
    "JobPolicy",
    "grace_of",
    "kill_delay",
    "shell_code",
]

DEFAULT_RECOVERIES = 10  # lost attempts a job recovers from unless told otherwise: preemption is not its fault
DEFAULT_GRACE = 5.0  # seconds a rank has between SIGTERM and SIGKILL unless told otherwise
MAX_GRACE = 3600.0
KILL_MARGIN = 5.0  # seconds a backend leaves the supervisor beyond the ranks' grace, to end them and write its record
GRACE_VAR = settings.JOB_STOP_GRACE.name  # a supervised job's ranks' grace (the backend waits longer)
# Set by a backend whose stop signals every process of the job itself (Ray): the supervisor then does not signal
# the ranks again, so a rank's SIGTERM handler runs once.
OWNER_SIGNALS_ALL_VAR = settings.JOB_STOP_SIGNALS_ALL.name
OUTCOMES = ("succeeded", "failed", "lost", "stopped")


def shell_code(code: int) -> int:
    """An exit code as a shell reports it: a process killed by signal N (Popen's -N) is 128 + N."""
    return 128 - code if code < 0 else code


def _codes(what: str, codes: Iterable[int] | None) -> frozenset[int] | None:
    if codes is None:
        return None
    if isinstance(codes, (str, bytes)) or not isinstance(codes, Iterable):
        raise TypeError(f"{what} must be a list of exit codes (ints 1-255), got {type(codes).__name__}")
    found = list(codes)
    for code in found:
        if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 255:
            raise ValueError(
                f"{what} holds {code!r}: exit codes are ints 1-255 (a rank killed by signal N has 128 + N)"
            )
    if not found:
        raise ValueError(f"{what} is empty: leave it out (None) to retry every failure")
    return frozenset(found)


@dataclass(frozen=True)
class JobPolicy:
    """A job's budgets and grace (create_job's max_retries, max_recoveries, retry_on_exit_codes,
    no_retry_on_exit_codes, stop_grace), checked."""

    max_retries: int = 0
    max_recoveries: int = DEFAULT_RECOVERIES
    retry_on_exit_codes: frozenset[int] | None = None
    no_retry_on_exit_codes: frozenset[int] | None = None
    stop_grace: float = DEFAULT_GRACE
    asked: bool = field(default=False, compare=False)  # any of these options given (the job is then supervised)

    @staticmethod
    def of(
        max_retries: int,
        max_recoveries: int | None,
        retry_on_exit_codes: Iterable[int] | None,
        no_retry_on_exit_codes: Iterable[int] | None,
        stop_grace: float | None,
    ) -> JobPolicy:
        for what, value in (("max_retries", max_retries), ("max_recoveries", max_recoveries)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{what} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{what} must be >= 0, got {value}")
        retry = _codes("retry_on_exit_codes", retry_on_exit_codes)
        no_retry = _codes("no_retry_on_exit_codes", no_retry_on_exit_codes)
        if retry is not None and no_retry is not None:
            raise ValueError(
                "give retry_on_exit_codes (retry only those) or no_retry_on_exit_codes (retry all but those), not both"
            )
        if (retry is not None or no_retry is not None) and max_retries == 0:
            which = "retry_on_exit_codes" if retry is not None else "no_retry_on_exit_codes"
            raise ValueError(
                f"{which} says which failures are retried, and max_retries=0 retries none: set max_retries"
            )
        if stop_grace is not None:
            if isinstance(stop_grace, bool) or not isinstance(stop_grace, (int, float)) or math.isnan(stop_grace):
                raise TypeError(f"stop_grace must be a number of seconds, got {stop_grace!r}")
            if not 0 <= stop_grace <= MAX_GRACE:
                raise ValueError(f"stop_grace must be between 0 and {MAX_GRACE:g} seconds, got {stop_grace}")
        return JobPolicy(
            max_retries,
            DEFAULT_RECOVERIES if max_recoveries is None else max_recoveries,
            retry,
            no_retry,
            DEFAULT_GRACE if stop_grace is None else float(stop_grace),
            asked=any(v is not None for v in (max_recoveries, retry, no_retry, stop_grace)),
        )

    def retries(self, code: int | None) -> bool:
        """Whether a failure with this exit code (Popen's: negative for a signal) may be retried, budget aside."""
        if code is None:
            return self.retry_on_exit_codes is None
        as_shell = shell_code(code)
        if self.retry_on_exit_codes is not None:
            return as_shell in self.retry_on_exit_codes
        return self.no_retry_on_exit_codes is None or as_shell not in self.no_retry_on_exit_codes

    def argv(self) -> list[str]:
        """The supervisor's options for this policy (fray.jobs.supervisor)."""
        argv = ["--recoveries", str(self.max_recoveries), "--grace", repr(self.stop_grace)]
        if self.retry_on_exit_codes is not None:
            argv += ["--retry-on-exit-codes", ",".join(map(str, sorted(self.retry_on_exit_codes)))]
        if self.no_retry_on_exit_codes is not None:
            argv += ["--no-retry-on-exit-codes", ",".join(map(str, sorted(self.no_retry_on_exit_codes)))]
        return argv


def grace_of(entrypoint: str) -> float:
    """The ranks' grace a supervised job's entrypoint names (--grace S), else the default."""
    words = entrypoint.split()
    for i, word in enumerate(words[:-1]):
        if word == "--grace":
            try:
                value = float(words[i + 1])
            except ValueError:
                break
            return min(max(value, 0.0), MAX_GRACE)
        if word == "--":
            break
    return DEFAULT_GRACE


def kill_delay(grace: float) -> float:
    """How long a backend waits after its SIGTERM before SIGKILL of a supervised job: the ranks' grace and the
    supervisor's margin."""
    return grace + KILL_MARGIN


def is_preemption_code(code: int) -> bool:
    """Whether a rank's exit says it got SIGTERM (killed by it, or exited 128 + SIGTERM as a shell does)."""
    return code == -signal.SIGTERM or code == 128 + signal.SIGTERM
