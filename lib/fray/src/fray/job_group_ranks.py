"""A job's ranks over several nodes: each rank a member of an SPMD actor group of the job's own backend
(fray.job_supervisor --placement pack|spread). The backend places the members over its nodes by each rank's
resources, as it places any group (docs/groups.md), sets torch.distributed's variables in each member's process
(and serves the rendezvous store in rank 0's), gives each its GPUs, and ends them all when one dies. A member runs
its rank, the job's command or callable, in a subprocess of its own process group, which fray.watchdog ends with
the member however the member ends; each line the rank writes goes to the member's stdout prefixed "[rank I] ",
which the backend forwards to the supervisor's, the job's log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO

from fray import watchdog
from fray.job_call import CALL_VAR, RESULT_FD_VAR, CallOutcome, read_outcome

__all__ = ["RankOutcome", "RankProcess"]


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended: its exit code (negative: killed by that signal) and, for a callable, how it went."""

    rank: int
    code: int
    call: CallOutcome | None = None


def _forward(stream: IO[bytes], rank: int) -> None:
    prefix = f"[rank {rank}] ".encode()
    out = sys.stdout.buffer
    for line in iter(stream.readline, b""):
        out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        out.flush()
    stream.close()


class RankProcess:
    """One member of a job's rank group: `run` runs the rank to its end and says how it ended."""

    def run(self, command: list[str] | None, call: str | None, attempt: int) -> RankOutcome:
        env = dict(os.environ)
        env["FRAY_JOB_ATTEMPT"] = str(attempt)
        rank = int(env.get("RANK", "0"))
        read_fd = write_fd = -1
        if call is not None:
            read_fd, write_fd = os.pipe()
            env[CALL_VAR] = call
            env[RESULT_FD_VAR] = str(write_fd)
            argv = [sys.executable, "-m", "fray.run_job_call"]
        else:
            assert command is not None
            argv = command
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(write_fd,) if write_fd >= 0 else (),
                start_new_session=True,  # its own group: the watchdog ends all of it with this member
            )
        except OSError as exc:
            print(f"[rank {rank}] fray: could not start {argv[0]!r}: {exc}", flush=True)
            return RankOutcome(rank, 127)
        finally:
            if write_fd >= 0:
                os.close(write_fd)
        watchdog.watch_group(proc.pid)
        outcome: list[CallOutcome] = []
        assert proc.stdout is not None
        threads = [threading.Thread(target=_forward, args=(proc.stdout, rank), daemon=True)]
        if read_fd >= 0:
            threads.append(threading.Thread(target=lambda: outcome.append(read_outcome(read_fd)), daemon=True))
        for thread in threads:
            thread.start()
        code = proc.wait()
        for thread in threads:
            thread.join(5.0)
        watchdog.forget_group(proc.pid)
        return RankOutcome(rank, code, outcome[0] if outcome else None)

    def __repr__(self) -> str:  # how a backend names the member in its forwarded output
        return "RankProcess"
