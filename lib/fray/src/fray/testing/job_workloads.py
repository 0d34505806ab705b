"""Callables the conformance suite runs as jobs (create_job(fn)): importable by reference in a job's process,
so they travel as names, as a user's module-level functions do."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any


def add(a: int, b: int = 1) -> dict[str, int]:
    print(f"adding {a} and {b} in rank {os.environ['RANK']}", flush=True)
    return {"sum": a + b, "rank": int(os.environ["RANK"])}


def fail(message: str) -> None:
    raise ValueError(message)


class Opaque:
    def __repr__(self) -> str:
        return "Opaque(42)"


def opaque() -> Opaque:
    return Opaque()


def rank_env() -> dict[str, str]:
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FRAY_JOB_ATTEMPT")
    return {key: os.environ.get(key, "") for key in keys}


def fail_first_attempt_on_rank(rank: int) -> str:
    """Fail (exit 1) in rank `rank` at attempt 1; succeed otherwise."""
    attempt = int(os.environ["FRAY_JOB_ATTEMPT"])
    print(f"rank {os.environ['RANK']} attempt {attempt}", flush=True)
    if int(os.environ["RANK"]) == rank and attempt == 1:
        sys.exit(1)
    return f"attempt {attempt}"


def gloo_allreduce(fail_rank: int = -1) -> float:
    """All-reduce over gloo across the job's ranks; rank `fail_rank` exits 1 after it at attempt 1."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    if dist.get_rank() == fail_rank and os.environ["FRAY_JOB_ATTEMPT"] == "1":
        sys.exit(1)
    dist.barrier()
    dist.destroy_process_group()
    return float(value.item())


def sleep_forever_in_rank_0_fail_in_rank_1(pid_file: str) -> None:
    """Rank 0 writes its pid and sleeps; rank 1 fails once rank 0's pid is written."""
    if os.environ["RANK"] == "0":
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(300)
        return
    deadline = time.time() + 60
    while not os.path.exists(pid_file) and time.time() < deadline:
        time.sleep(0.05)
    raise RuntimeError("rank 1 fails")


def holds_a_lock() -> Any:
    lock = threading.Lock()

    def uses_it() -> None:
        with lock:
            pass

    return uses_it


def env_after_failing_once_on_rank(rank: int) -> dict[str, str]:
    """fail_first_attempt_on_rank, then this rank's torch.distributed variables."""
    fail_first_attempt_on_rank(rank)
    return rank_env()


def _write_atomically(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def wait_to_be_signalled_once(pid_file: str) -> dict[str, int]:
    """At attempt 1: write "RANK_PID SUPERVISOR_PID" to pid_file and sleep (for the test to signal one of them);
    later attempts return their number."""
    attempt = int(os.environ["FRAY_JOB_ATTEMPT"])
    if attempt == 1:
        _write_atomically(pid_file, f"{os.getpid()} {os.getppid()}")
        time.sleep(300)
    return {"attempt": attempt}


def checkpoint_on_sigterm(checkpoint: str, ready_file: str, takes: float) -> None:
    """Sleep until SIGTERM; then take `takes` seconds to write `checkpoint`.RANK (atomically) and exit 0. Writes
    ready_file.RANK once its handler is set."""
    import signal

    rank = os.environ["RANK"]

    def save(signum: int, frame: object) -> None:
        time.sleep(takes)  # a checkpoint that takes longer than fray's default grace
        _write_atomically(f"{checkpoint}.{rank}", f"step 42 of attempt {os.environ['FRAY_JOB_ATTEMPT']}")
        os._exit(0)

    signal.signal(signal.SIGTERM, save)
    _write_atomically(f"{ready_file}.{rank}", str(os.getpid()))
    time.sleep(300)


def checkpointed_steps(steps: int, fail_at_attempt_1: int) -> dict[str, Any]:
    """The torch pattern without torch: load the last checkpoint from fray.job_dir() when fray.resuming(), save
    one every step; fail (exit 1) at step `fail_at_attempt_1` of attempt 1."""
    import json

    import fray

    directory = fray.job_dir()
    path = directory / "checkpoint.json"
    resuming = fray.resuming()
    start = json.loads(path.read_text())["step"] if resuming and path.exists() else 0
    attempt = int(os.environ["FRAY_JOB_ATTEMPT"])
    for step in range(start, steps):
        if attempt == 1 and step == fail_at_attempt_1:
            sys.exit(1)
        _write_atomically(str(path), json.dumps({"step": step + 1}))
    mode = os.stat(directory).st_mode & 0o777
    return {"dir": str(directory), "mode": mode, "resuming": resuming, "started_at": start, "attempt": attempt}


def die_leaving_a_child(pid_file: str) -> int:
    """At attempt 1: start a child that would sleep for 300 s, write its pid, and die by SIGKILL (the child is
    left behind); later attempts return their number."""
    import signal
    import subprocess

    attempt = int(os.environ["FRAY_JOB_ATTEMPT"])
    if attempt == 1:
        child = subprocess.Popen(["sleep", "300"])
        _write_atomically(pid_file, str(child.pid))
        os.kill(os.getpid(), signal.SIGKILL)
    return attempt


def note_world_size(out_dir: str, kill_a_rank_at_attempt_1: bool) -> int:
    """Write `attempt-A.rank-R` holding WORLD_SIZE into out_dir; with kill_a_rank_at_attempt_1, the last rank of
    attempt 1 waits (at most 60 s) for every rank's file of its attempt, then dies by SIGKILL."""
    import signal

    attempt, rank, size = (int(os.environ[k]) for k in ("FRAY_JOB_ATTEMPT", "RANK", "WORLD_SIZE"))
    _write_atomically(os.path.join(out_dir, f"attempt-{attempt}.rank-{rank}"), str(size))
    if kill_a_rank_at_attempt_1 and attempt == 1 and rank == size - 1:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(n.startswith("attempt-1.") and not n.endswith(".tmp") for n in os.listdir(out_dir)) >= size:
                break
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
    return size
