"""A job's own first process when it has ranks, retries or a Python callable:

    python -m fray.job_supervisor [--replicas N] [--retries R] [--gpus-per-rank G]
                                  [--placement pack|spread --rank-resources JSON] (--call LABEL | -- COMMAND ...)

It starts the job's N ranks (COMMAND, or the callable of FRAY_JOB_CALL: fray.run_job_call) with the variables of
torch.distributed set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; a fresh
port each attempt), each with its own GPUs where it asks for some. One rank failing ends the attempt: the others are
stopped (SIGTERM to each one's process tree, SIGKILL after a grace period). A failed attempt runs again, up to R
more times; a stopped job (SIGTERM or SIGINT to this process, which is how every backend stops a job) does not.
With several ranks, each line a rank writes is prefixed "[rank I] ". After each attempt a record of all attempts so
far (fray.job_records) goes to stdout, the job's log, where ClusterContext.get_job reads it. The ranks stay in
this process's group, so a backend that stops or kills the job's group reaches them too.

Every backend runs this as an ordinary job command: ranks, retries and callables work the same on all of them.
The ranks run on the host this process runs on; with --placement, each attempt's ranks are instead an SPMD group
of the job's own backend (fray.init(): the backend the job was submitted to), which places them over its nodes
with --rank-resources each (fray.job_group_ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any

from fray.job_call import CALL_VAR, RESULT_FD_VAR, CallOutcome, read_outcome, take_stashed_call
from fray.job_group_ranks import RankPoll, RankProcess
from fray.job_records import JobRecord, record_line
from fray.jobs import ended_status
from fray.procfs import Identity, children_of
from fray.rendezvous import AGENT_STORE_ENV, serve_job_store
from fray.types import JobAttempt, JobError, JobStatus

__all__ = ["main"]

STOP_GRACE = 5.0  # seconds a rank has to end after SIGTERM before SIGKILL
GROUP_POLL = 0.25  # seconds between polls of a group's ranks while none wrote anything
GROUP_CALL_TIMEOUT = 120.0  # seconds a group's member has to answer a start or a poll
POLL = 0.05
VISIBLE = "CUDA_VISIBLE_DEVICES"


@dataclass
class _Rank:
    index: int
    proc: subprocess.Popen[bytes]
    threads: list[threading.Thread] = field(default_factory=list)
    outcome: list[CallOutcome] = field(default_factory=list)  # a callable's, once read


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpu_slices(replicas: int, per_rank: int) -> list[str | None]:
    """Each rank's CUDA_VISIBLE_DEVICES: consecutive slices of what this process sees (its CUDA_VISIBLE_DEVICES,
    else the host's GPUs)."""
    if per_rank <= 0:
        return [None] * replicas
    from fray.gpus import discover  # only where GPUs are asked for (it may run nvidia-smi)

    given = os.environ.get(VISIBLE)
    entries = [e.strip() for e in given.split(",") if e.strip()] if given is not None else list(discover().entries)
    if len(entries) < replicas * per_rank:
        raise ValueError(
            f"{replicas} ranks of {per_rank} GPU(s) each need {replicas * per_rank} GPUs; this host shows the job "
            f"{len(entries)} ({VISIBLE}={given!r})"
        )
    return [",".join(entries[i * per_rank : (i + 1) * per_rank]) for i in range(replicas)]


def _prefix_lines(stream: IO[bytes], index: int, lock: threading.Lock) -> None:
    out = sys.stdout.buffer
    prefix = f"[rank {index}] ".encode()
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
            out.flush()
    stream.close()


def _descendants(pid: int) -> list[Identity]:
    found, queue = [], [pid]
    while queue:
        for child in children_of(queue.pop()):
            identity = Identity.of(child)
            if identity is not None:
                found.append(identity)
                queue.append(child)
    return found


def _signal_tree(rank: _Rank, signum: int) -> None:
    """Signal a rank and every process under it, each only while proven the one listed (pid, start time)."""
    if rank.proc.poll() is not None:
        return
    targets = _descendants(rank.proc.pid)
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


class Supervisor:
    def __init__(
        self,
        command: list[str],
        replicas: int,
        retries: int,
        gpus_per_rank: int,
        call: bool,
        placement: str | None = None,
        rank_resources: dict[str, float] | None = None,
    ) -> None:
        self.command = command
        self.replicas = replicas
        self.retries = retries
        self.call = call
        self.placement = placement
        self.rank_resources = rank_resources or {}
        # over nodes, the backend gives each rank its GPUs; here, this host's are sliced
        self.gpus = _gpu_slices(replicas, gpus_per_rank) if placement is None else [None] * replicas
        self.attempts: list[JobAttempt] = []
        self.stopping = threading.Event()
        self.output_lock = threading.Lock()
        self.context: Any = None  # the job backend's JobContext, for --placement
        self.stores: list[Any] = []  # the rendezvous stores served for the attempts' ranks

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping.set()

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        last = 1
        for number in range(1, self.retries + 2):
            if number > 1:
                self._say(f"attempt {number} of {self.retries + 1} (the last failed: {self.attempts[-1].message})")
            attempt, error, result = self._attempt(number) if self.placement is None else self._group_attempt(number)
            self.attempts.append(attempt)
            ends = attempt.status in (JobStatus.SUCCEEDED, JobStatus.STOPPED) or self.stopping.is_set()
            self._record(error, result, final=ends or number == self.retries + 1)
            if attempt.status is JobStatus.SUCCEEDED:
                return 0
            code = attempt.exit_code
            last = code if code is not None and 0 < code < 256 else (128 - code if code and code < 0 else 1)
            if attempt.status is JobStatus.STOPPED or self.stopping.is_set():
                return 128 + signal.SIGTERM
        return last

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

    def _start(self, index: int, port: int, number: int, store_served: bool) -> _Rank:
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
            FRAY_JOB_ATTEMPT=str(number),
        )
        if self.gpus[index] is not None:
            env[VISIBLE] = str(self.gpus[index])
        read_fd = write_fd = -1
        if self.call:
            read_fd, write_fd = os.pipe()
            env[RESULT_FD_VAR] = str(write_fd)
            argv = [sys.executable, "-m", "fray.run_job_call"]
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
            )
        finally:
            if write_fd >= 0:
                os.close(write_fd)
        rank = _Rank(index, proc)
        if piped:
            assert proc.stdout is not None
            rank.threads.append(
                threading.Thread(target=_prefix_lines, args=(proc.stdout, index, self.output_lock), daemon=True)
            )
        if read_fd >= 0:
            rank.threads.append(
                threading.Thread(target=lambda: rank.outcome.append(read_outcome(read_fd)), daemon=True)
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
            self.stores.append(served[1])
        port = served[0] if served is not None else _free_port()
        ranks: list[_Rank] = []
        try:
            for index in range(self.replicas):
                ranks.append(self._start(index, port, number, served is not None))
        except OSError as exc:
            for rank in ranks:
                _signal_tree(rank, signal.SIGKILL)
            self._say(f"could not start rank {len(ranks)}: {exc}")
            return JobAttempt(number, JobStatus.FAILED, 127, start, time.time(), f"could not start: {exc}"), None, None
        failed: _Rank | None = None
        while failed is None and not self.stopping.is_set():
            codes = [rank.proc.poll() for rank in ranks]
            failed = next((r for r, c in zip(ranks, codes, strict=True) if c not in (None, 0)), None)
            if failed is None and all(c == 0 for c in codes):
                break
            if failed is None:
                time.sleep(POLL)
        if failed is not None or self.stopping.is_set():
            self._stop(ranks)
        for rank in ranks:
            rank.proc.wait()
            for thread in rank.threads:
                thread.join(STOP_GRACE)  # a grandchild may hold a rank's output open: not waited for beyond this
        end = time.time()
        outcomes = {rank.index: rank.outcome[0] for rank in ranks if rank.outcome}
        code = failed.proc.returncode if failed is not None else None
        failed_rank = failed.index if failed is not None else None
        return self._ended(number, start, end, failed_rank, code, outcomes)

    def _group_attempt(self, number: int) -> tuple[JobAttempt, JobError | None, CallOutcome | None]:
        """One attempt with the ranks as an SPMD group of the job's backend (see fray.job_group_ranks)."""
        import fray  # only here: a job on one host never starts a fray context of its own
        from fray.types import ActorOptions

        start = time.time()
        if self.context is None:
            self.context = fray.init()  # the job's backend (its FRAY_BACKEND)
        ctx = self.context
        call = os.environ.get(CALL_VAR) if self.call else None
        try:
            group = ctx.create_actor_group(
                RankProcess,
                self.replicas,
                options=ActorOptions(resources=self.rank_resources),
                placement=str(self.placement),
                distributed=True,
            )
            ctx.get(group.start(None if self.call else self.command, call, number), timeout=GROUP_CALL_TIMEOUT)
        except Exception as exc:  # not placed (InfeasibleResourcesError...), or not started: the attempt failed
            self._say(f"could not start the {self.replicas} ranks: {type(exc).__name__}: {exc}")
            return JobAttempt(number, JobStatus.FAILED, None, start, time.time(), f"not started: {exc}"), None, None
        ended: dict[int, RankPoll] = {}
        failed: int | None = None
        while len(ended) < self.replicas and failed is None and not self.stopping.is_set():
            running = [index for index in range(self.replicas) if index not in ended]
            refs = [group[index].poll() for index in running]
            quiet = True
            for index, ref in zip(running, refs, strict=True):
                try:
                    polled: RankPoll = ctx.get(ref, timeout=GROUP_CALL_TIMEOUT)
                except Exception as exc:  # its member died (a node lost; the group fails as one) or hangs
                    self._say(f"rank {index}: {type(exc).__name__}: {exc}")
                    polled = RankPoll(code=-9)
                self._write(index, polled)
                quiet = quiet and not polled.lines
                if polled.code is not None:
                    ended[index] = polled
                    if polled.code != 0 and failed is None:
                        failed = index
            if quiet and failed is None:
                time.sleep(GROUP_POLL)
        ctx.kill(group)  # the rest, if one failed or a stop came (their ranks go with them: the watchdog)
        end = time.time()
        code = (ended[failed].code or -9) if failed is not None else None
        return self._ended(number, start, end, failed, code, {i: p.call for i, p in ended.items() if p.call})

    def _ended(
        self,
        number: int,
        start: float,
        end: float,
        failed: int | None,
        code: int | None,
        outcomes: dict[int, CallOutcome],
    ) -> tuple[JobAttempt, JobError | None, CallOutcome | None]:
        """How an attempt ended (either way of running its ranks): the rank that failed first, with its exit code,
        else stopped or succeeded; `outcomes` are the callables' (rank 0's is the job's result)."""
        if failed is None and self.stopping.is_set():
            return JobAttempt(number, JobStatus.STOPPED, None, start, end, "stopped by request"), None, None
        if failed is None or code is None:
            return JobAttempt(number, JobStatus.SUCCEEDED, 0, start, end, ""), None, outcomes.get(0)
        who = f"rank {failed}" if self.replicas > 1 else "it"
        message = f"{who} {ended_status(code)[2]}"
        error = None
        raised = outcomes.get(failed)
        if raised is not None and raised.error is not None:
            error = raised.error
            message = f"{who} raised {error.type}: {error.message}"
        return JobAttempt(number, JobStatus.FAILED, code, start, end, message), error, None

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

    def _stop(self, ranks: Sequence[_Rank]) -> None:
        for rank in ranks:
            _signal_tree(rank, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while any(rank.proc.poll() is None for rank in ranks) and time.monotonic() < deadline:
            time.sleep(POLL)
        for rank in ranks:
            _signal_tree(rank, signal.SIGKILL)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fray.job_supervisor", description=__doc__.split("\n\n")[1])
    parser.add_argument("--replicas", type=int, default=1, help="ranks to start (default 1)")
    parser.add_argument("--retries", type=int, default=0, help="times to run again after a failed attempt")
    parser.add_argument("--gpus-per-rank", type=int, default=0, help="GPUs each rank holds")
    parser.add_argument(
        "--call", default=None, metavar="LABEL", help=f"run the callable in ${CALL_VAR} in each rank (LABEL names it)"
    )
    parser.add_argument(
        "--placement", choices=("pack", "spread"), default=None, help="the ranks as a group over the nodes"
    )
    parser.add_argument("--rank-resources", default="{}", help="with --placement: each rank's resources (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if (args.call is not None) == bool(args.command):
        parser.error("give either --call or a command after --")
    if args.call is not None and CALL_VAR not in os.environ:
        parser.error(f"--call needs the call in ${CALL_VAR} (ClusterContext.create_job(fn) sets it)")
    if args.replicas < 1 or args.retries < 0 or args.gpus_per_rank < 0:
        parser.error("--replicas must be >= 1, --retries and --gpus-per-rank >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    take_stashed_call()  # (the call kept out of a job record that others may read: fray.job_call)
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        supervisor = Supervisor(
            args.command,
            args.replicas,
            args.retries,
            args.gpus_per_rank,
            args.call is not None,
            args.placement,
            {str(k): float(v) for k, v in json.loads(args.rank_resources).items()},
        )
    except ValueError as exc:
        print(f"fray: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        return supervisor.run()
    finally:
        if supervisor.context is not None:
            supervisor.context.shutdown()


if __name__ == "__main__":
    sys.exit(main())
