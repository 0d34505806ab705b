"""A job's own first process when it has ranks, retries or a Python callable:

    python -m fray.jobs.supervisor [--replicas N|MIN:MAX] [--retries R] [--recoveries L] [--grace S] [--gpus-per-rank G]
                                  [--retry-on-exit-codes C,.. | --no-retry-on-exit-codes C,..]
                                  [--placement pack|spread|node --rank-resources JSON] (--call LABEL | -- COMMAND ...)

It starts the job's N ranks (COMMAND, or the callable of FRAY_JOB_CALL: fray.jobs.run_call) with the variables of
torch.distributed set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; a fresh
port each attempt), each with its own GPUs where it asks for some. One rank failing ends the attempt: the others are
stopped (SIGTERM to each one's process tree, SIGKILL after S seconds). A failed attempt runs again, up to R more
times (those exit codes only, or all but those); a lost one (preempted, fray.jobs.signals; a node lost) up to L
times, while the process the job dies with (FRAY_JOB_OWNER) runs; a stopped job (SIGTERM from the backend that started
it, or SIGINT) does not (fray.jobs.outcomes).
With several ranks, each line a rank writes is prefixed "[rank I] ". After each attempt a record of all attempts so
far (fray.jobs.records) goes to stdout, the job's log, where ClusterContext.get_job reads it. The ranks stay in
this process's group, so a backend that stops or kills the job's group reaches them too.

Every backend runs this as an ordinary job command: ranks, retries and callables work the same on all of them.
The ranks run on the host this process runs on; with --placement, each attempt's ranks are instead an SPMD group
of the job's own backend (fray.init(): the backend the job was submitted to), which places them over its nodes
with --rank-resources each (fray.jobs.group_ranks); --replicas MIN:MAX there counts them at each attempt's start,
as many as the nodes then hold (fray.jobs.elastic). `--placement node` places them all on one node, as if on this
process's host, this process holding nothing (a backend that keeps it apart: fray.jobs.requests.ONE_NODE).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fray.errors import FrayError
from fray.host import settings
from fray.host.procfs import Identity
from fray.jobs.call import RESULT_FD_VAR, CallOutcome, read_outcome, take_stashed_call
from fray.jobs.dirs import RESUMING_VAR, resuming_now
from fray.jobs.elastic import world_size
from fray.jobs.outcomes import AttemptEnd, judge, next_step
from fray.jobs.policy import JobPolicy, is_preemption_code
from fray.jobs.rank_procs import (
    VISIBLE,
    Rank,
    become_subreaper,
    end_leftovers,
    free_port,
    gpu_slices,
    prefix_lines,
    signal_tree,
)
from fray.jobs.records import JobRecord, record_line
from fray.jobs.recovery import recovered_attempts
from fray.jobs.signals import StopSignals, unblock_in_child
from fray.jobs.supervisor_args import parse_args
from fray.runtime.gang import died_rank
from fray.runtime.rendezvous import AGENT_STORE_ENV, LazyStore, serve_job_store
from fray.types import JobAttempt, JobError, JobStatus

if TYPE_CHECKING:
    from fray.jobs.group_ranks import RankPoll

__all__ = ["main"]

SETTLE = 0.5  # seconds a rank killed by SIGTERM waits for the backend's stop to be seen (a stop, not a preemption)
OWNER_SETTLE = 0.5  # seconds after a lost attempt during which the job's owner ending means it went with the job
GROUP_POLL = 0.25  # seconds between polls of a group's ranks while none wrote anything
GROUP_CALL_TIMEOUT = 120.0  # seconds a group's member has to answer a start or a poll
POLL = 0.05


class Supervisor:
    def __init__(
        self,
        command: list[str],
        replicas: int | tuple[int, int],
        policy: JobPolicy,
        gpus_per_rank: int,
        call: bool,
        placement: str | None = None,
        rank_resources: dict[str, float] | None = None,
    ) -> None:
        self.command = command
        # (min, max) over the nodes: an elastic job's ranks, counted at each attempt's start
        self.bounds = replicas if isinstance(replicas, tuple) else (replicas, replicas)
        self.replicas = self.bounds[1]
        self.policy = policy
        self.call = call
        self.placement = placement
        self.rank_resources = rank_resources or {}
        # over nodes, the backend gives each rank its GPUs; here, this host's are sliced
        self.gpus = gpu_slices(self.replicas, gpus_per_rank) if placement is None else [None] * self.replicas
        self.attempts: list[JobAttempt] = []
        self.signals: StopSignals | None = None  # (made in run: before any thread starts)
        self.resuming: str | None = None  # the attempt's FRAY_JOB_RESUMING
        self.subreaper = False  # whether what a rank leaves behind becomes this process's child
        self.output_lock = threading.Lock()
        self.context: Any = None  # the job backend's JobContext, for --placement
        self.stores: list[LazyStore] = []  # the rendezvous stores served for the attempts' ranks
        owner = settings.JOB_OWNER.read()
        self.owner = Identity.of(owner) if owner is not None else None  # (alive now: the job's own start)

    @property
    def stopping(self) -> threading.Event:
        assert self.signals is not None
        return self.signals.requested

    def run(self) -> int:
        if self.signals is None:
            self.signals = StopSignals()
        self.subreaper = self.placement is None and become_subreaper()  # (a group's fray context has children)
        self.attempts = recovered_attempts(self.replicas)  # (run again after its hosts were lost: fray.jobs.recovery)
        number = len(self.attempts)
        if self.attempts and (ends := next_step(self.policy, self.attempts)) is not None:
            self._record(None, None, final=True)
            self._say(f"the job ends: {ends}")
            return 1
        while True:
            number += 1
            if number > 1:
                self._say(self._again(number))
            self.resuming = self._resuming(number)
            attempt, error, result = self._attempt(number) if self.placement is None else self._group_attempt(number)
            self.attempts.append(attempt)
            ends = next_step(self.policy, self.attempts) if not self.signals.stopping else "stopped"
            self._record(error, result, final=ends is not None)
            if attempt.outcome == "lost":
                if ends is None and self._owner_ended():
                    # A scheduler ending every process of the job at once (a Slurm preemption): the SIGKILL comes
                    # next, and whatever runs the job again (its backend) does it elsewhere.
                    self._say("the process that runs this job ended with it: no further attempt here")
                    return 128 + signal.SIGTERM
                self.signals.take_preemption()  # handled: the next attempt runs
            if ends is None:
                continue
            if attempt.status is JobStatus.SUCCEEDED:
                return 0
            if ends == "stopped":
                return 128 + signal.SIGTERM
            if attempt.outcome == "lost":
                self._say(f"the job ends: {ends}")
            code = attempt.exit_code
            return code if code is not None and 0 < code < 256 else (128 - code if code and code < 0 else 1)

    def _owner_ended(self) -> bool:
        """Whether the process the job dies with (FRAY_JOB_OWNER: its job runner, its submitting process) has ended,
        or ends within OWNER_SETTLE s: it got the same signal as this attempt's ranks."""
        if self.owner is None:
            return False
        deadline = time.monotonic() + OWNER_SETTLE
        while self.owner.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL)
        return True

    def _again(self, number: int) -> str:
        """The line that opens a retry (at most 1 + max_retries + the lost attempts) or a recovery."""
        last = self.attempts[-1]
        lost = sum(a.outcome == "lost" for a in self.attempts)
        if last.outcome == "lost":
            return (
                f"attempt {number} (the last was lost: {last.message}; recovery {lost} of {self.policy.max_recoveries})"
            )
        return f"attempt {number} of {1 + self.policy.max_retries + lost} (the last failed: {last.message})"

    def _resuming(self, number: int) -> str | None:
        """FRAY_JOB_RESUMING for this attempt's ranks ("1"/"0", fray.jobs.dirs); None where the job's directory
        cannot be reached from here (each rank then looks for itself)."""
        try:
            return "1" if resuming_now(settings.JOB_NAME.read(), number) else "0"
        except (OSError, FrayError) as exc:
            self._say(f"the job's directory: {exc}")
            return None

    def _say(self, text: str) -> None:
        with self.output_lock:
            sys.stdout.write(f"[fray] {text}\n")
            sys.stdout.flush()

    def _record(self, error: JobError | None, result: CallOutcome | None, final: bool) -> None:
        data = result.result if result is not None else None
        record = JobRecord(
            self.replicas,
            tuple(self.attempts),
            result_repr=result.result_repr if result is not None else None,
            error=error,
        )
        with self.output_lock:
            sys.stdout.flush()
            sys.stdout.write(record_line(record, data, final))
            sys.stdout.flush()

    def _start(self, index: int, port: int, number: int, store_served: bool) -> Rank:
        env = dict(os.environ)
        if store_served:  # torch's env:// rendezvous on every rank is a client of the store served here
            env[AGENT_STORE_ENV] = "True"
        env.update(
            RANK=str(index),
            WORLD_SIZE=str(self.replicas),
            LOCAL_RANK=str(index),
            LOCAL_WORLD_SIZE=str(self.replicas),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        env[settings.JOB_ATTEMPT.name] = str(number)
        if self.resuming is not None:
            env[RESUMING_VAR] = self.resuming
        if self.gpus[index] is not None:
            env[VISIBLE] = str(self.gpus[index])
        read_fd = write_fd = -1
        if self.call:
            read_fd, write_fd = os.pipe()
            env[RESULT_FD_VAR] = str(write_fd)
            argv = [sys.executable, "-m", "fray.jobs.run_call"]
        else:
            argv = self.command
        piped = self.replicas > 1
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if piped else None,
                stderr=subprocess.STDOUT if piped else None,
                env=env,
                pass_fds=(write_fd,) if write_fd >= 0 else (),
                preexec_fn=unblock_in_child,  # (this process blocks SIGTERM: fray.jobs.signals)
            )
        finally:
            if write_fd >= 0:
                os.close(write_fd)
        rank = Rank(index, proc)
        if piped:
            assert proc.stdout is not None
            rank.threads.append(
                threading.Thread(
                    target=prefix_lines,
                    args=(proc.stdout, index, self.output_lock),
                    name=f"fray-rank-{index}-output",
                    daemon=True,
                )
            )
        if read_fd >= 0:
            rank.threads.append(
                threading.Thread(
                    target=lambda: rank.outcome.append(read_outcome(read_fd)),
                    name=f"fray-rank-{index}-outcome",
                    daemon=True,
                )
            )
        for thread in rank.threads:
            thread.start()
        return rank

    def _attempt(self, number: int) -> tuple[JobAttempt, JobError | None, CallOutcome | None]:
        start = time.time()
        # Several ranks rendezvous (torch.distributed): their store is served here, on loopback alone (rank 0 would
        # serve it on every interface); kept until this process ends (an attempt's ranks may outlive it briefly).
        served = serve_job_store("127.0.0.1", self.replicas) if self.replicas > 1 else None
        if served is not None:
            self.stores.append(served)
        port = served.port if served is not None else free_port()
        ranks: list[Rank] = []
        try:
            for index in range(self.replicas):
                ranks.append(self._start(index, port, number, served is not None))
        except OSError as exc:
            for rank in ranks:
                signal_tree(rank, signal.SIGKILL)
            self._say(f"could not start rank {len(ranks)}: {exc}")
            return self._unstarted(number, start, 127, f"could not start: {exc}")
        failed: Rank | None = None
        while failed is None and not self.stopping.is_set():
            codes = [rank.proc.poll() for rank in ranks]
            failed = next((r for r, c in zip(ranks, codes, strict=True) if c not in (None, 0)), None)
            if failed is None and all(c == 0 for c in codes):
                break
            if failed is None:
                time.sleep(POLL)
        if failed is not None and is_preemption_code(failed.proc.returncode):
            self.stopping.wait(SETTLE)  # the backend's stop may signal the ranks before this process hears of it
        grace, killed = self._stop(ranks) if failed is not None or self.stopping.is_set() else (None, False)
        for rank in ranks:
            rank.proc.wait()
        if self.subreaper and (failed is not None or self.stopping.is_set()):
            end_leftovers()  # what the ranks left running (their own children) ends with a failed or stopped attempt
        for rank in ranks:
            for thread in rank.threads:
                thread.join(5.0)  # a grandchild may hold a rank's output open: not waited for beyond this
        return judge(
            AttemptEnd(
                number,
                start,
                time.time(),
                self.replicas,
                failed.index if failed is not None else None,
                failed.proc.returncode if failed is not None else None,
                request=self._request(),
                grace=grace,
                killed=killed,
                outcomes={rank.index: rank.outcome[0] for rank in ranks if rank.outcome},
            )
        )

    def _unstarted(self, number: int, start: float, code: int | None, why: str) -> tuple[JobAttempt, None, None]:
        """A failed attempt whose ranks did not all start."""
        end = time.time()
        return JobAttempt(number, JobStatus.FAILED, code, start, end, why, "failed", None, self.replicas), None, None

    def _request(self) -> Any:
        return self.signals.request if self.signals is not None and self.stopping.is_set() else None

    def _group_attempt(self, number: int) -> tuple[JobAttempt, JobError | None, CallOutcome | None]:
        """One attempt with the ranks as an SPMD group of the job's backend (see fray.jobs.group_ranks)."""
        # Only here: a job on one host never starts a fray context of its own, nor loads what one needs.
        import fray
        from fray.jobs.group_ranks import own_gpus_of, rank_group

        start = time.time()
        if self.context is None:
            self.context = fray.init()  # the job's backend (its FRAY_BACKEND)
        ctx = self.context
        call = settings.JOB_CALL.read() if self.call else None
        try:
            if self.bounds[0] < self.bounds[1]:  # elastic: as many as the nodes hold now (a node lost: fewer)
                self.replicas = world_size(self.bounds, self.rank_resources, ctx.node_resources())
            group = rank_group(ctx, str(self.placement), self.replicas, self.rank_resources, self.stopping, self._say)
            command, own_gpus = (
                None if self.call else self.command,
                own_gpus_of(str(self.placement), self.rank_resources),
            )
            ctx.get(group.start(command, call, number, self.resuming, own_gpus), timeout=GROUP_CALL_TIMEOUT)
        except Exception as exc:  # not placed (InfeasibleResourcesError...), or not started: the attempt failed
            self._say(f"could not start the {self.replicas} ranks: {type(exc).__name__}: {exc}")
            return self._unstarted(number, start, None, f"not started: {exc}")
        ended: dict[int, RankPoll] = {}
        failed: int | None = None
        lost: str | None = None
        stop_sent: float | None = None  # when the ranks got SIGTERM (a stop or preemption): they have the grace
        while len(ended) < self.replicas and failed is None and lost is None:
            if self.stopping.is_set() and stop_sent is None:
                stop_sent = time.monotonic()
                for index in range(self.replicas):
                    if index not in ended:
                        group[index].terminate()
            if stop_sent is not None and time.monotonic() - stop_sent > self.policy.stop_grace:
                break
            running = [index for index in range(self.replicas) if index not in ended]
            refs = [group[index].poll() for index in running]
            quiet = True
            for index, ref in zip(running, refs, strict=True):
                try:
                    polled: RankPoll = ctx.get(ref, timeout=GROUP_CALL_TIMEOUT)
                except Exception as exc:  # its member died (a node lost; the group fails as one) or hangs
                    died = died_rank(str(exc))  # (every member's poll fails alike: the error names the rank)
                    failed, lost = index if died is None else died, f"{type(exc).__name__}: {exc}"
                    self._say(f"rank {failed}: {lost}")
                    break
                self._write(index, polled)
                quiet = quiet and not polled.lines
                if polled.code is not None:
                    ended[index] = polled
                    if polled.code != 0 and failed is None and stop_sent is None:
                        failed = index
            if quiet and failed is None:
                time.sleep(GROUP_POLL)
        ctx.kill(group)  # the rest, if one failed or a stop came (their ranks go with them: the watchdog)
        grace = None if stop_sent is None else min(time.monotonic() - stop_sent, self.policy.stop_grace)
        return judge(
            AttemptEnd(
                number,
                start,
                time.time(),
                self.replicas,
                failed,
                ended[failed].code if failed is not None and failed in ended else None,
                node_lost=lost,
                request=self._request(),
                grace=grace,
                killed=stop_sent is not None and len(ended) < self.replicas,
                outcomes={i: p.call for i, p in ended.items() if p.call},
            )
        )

    def _write(self, index: int, polled: RankPoll) -> None:
        """A rank's lines, as they came from its member, into the job's log."""
        if not polled.lines and not polled.dropped:
            return
        prefix = f"[rank {index}] "
        text = "".join(prefix + (line if line.endswith("\n") else line + "\n") for line in polled.lines)
        if polled.dropped:
            text = f"{prefix}fray: {polled.dropped} lines dropped (written faster than they were collected)\n" + text
        with self.output_lock:
            sys.stdout.write(text)
            sys.stdout.flush()

    def _stop(self, ranks: Sequence[Rank]) -> tuple[float | None, bool]:
        """SIGTERM the ranks, SIGKILL what is left after the grace; for a stop or preemption, the seconds they took
        and whether one was still running at the end (nothing recorded where a rank's failure ended the attempt)."""
        request = self._request()
        owner_signalled = request is not None and not request.preempted and settings.JOB_STOP_SIGNALS_ALL.read()
        began = time.monotonic()
        if not owner_signalled:  # (the backend's stop reached every rank: a handler runs once)
            for rank in ranks:
                signal_tree(rank, signal.SIGTERM)
        deadline = began + self.policy.stop_grace
        while any(rank.proc.poll() is None for rank in ranks) and time.monotonic() < deadline:
            time.sleep(POLL)
        killed = any(rank.proc.poll() is None for rank in ranks)
        for rank in ranks:
            signal_tree(rank, signal.SIGKILL)
        if request is None:
            return None, False
        return min(time.monotonic() - began, self.policy.stop_grace), killed


def main(argv: Sequence[str] | None = None) -> int:
    signals = StopSignals()  # first: before any thread starts, each of which would otherwise take a SIGTERM
    take_stashed_call()  # (the call kept out of a job record that others may read: fray.jobs.call)
    args = parse_args(sys.argv[1:] if argv is None else argv, __doc__.split("\n\n")[1])
    try:
        supervisor = Supervisor(
            args.command,
            args.replicas,
            args.policy,
            args.gpus_per_rank,
            args.call is not None,
            args.placement,
            {str(k): float(v) for k, v in json.loads(args.rank_resources).items()},
        )
    except ValueError as exc:
        print(f"fray: {exc}", file=sys.stderr, flush=True)
        return 2
    supervisor.signals = signals
    try:
        return supervisor.run()
    finally:
        if supervisor.context is not None:
            supervisor.context.shutdown()


if __name__ == "__main__":
    sys.exit(main())
