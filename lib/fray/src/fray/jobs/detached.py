"""Detached local jobs: jobs that outlive the process that started them, kept in the state directory.

    <state dir>/jobs/<job id>/       (see fray.host.state_dir for where the state directory is)
        job.json    what to run, written once by the submitter: entrypoint, env, working dir, submission time
        state.json  written by the job's runner as things happen: status, its own and the job's process identities
                    (pid, start time, boot: fray.host.procfs), times, exit code, message
        log         the job's stdout and stderr
        stop        there once someone asked the job to stop (holds the reason)
        runner.log  the runner's own errors (normally empty)

Each job has a small runner process (`python -m fray.jobs.detached JOB_DIR`) in a session of its own: it starts the
job (a process group of its own), records its pid, waits for it and records how it ended. So any process can
read a job's status, follow its log, stop it (SIGTERM to its group, SIGKILL after a grace period) or delete it.
A job whose runner died before recording the end is reported FAILED, saying so; stop and delete still end
whatever is left of its processes. A group is signalled only while the job may still run (its runner recorded no
end) and only once it is proven the job's (fray.host.procfs.Identity): a recorded pid may since belong to anyone.
What is recorded is trusted only from private directories of this user's: the state directory, the jobs
directory and each job's directory are checked at each use (fray.host.state_dir.private_dir: not a symlink, this user's,
0700) and state.json must be this user's file; anything else is refused with FrayError, never read.
"""

from __future__ import annotations

import builtins
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from fray.errors import GetTimeoutError, JobExistsError, JobNotFoundError
from fray.host import settings
from fray.host.procfs import Identity, group_members, stop_group
from fray.host.state_dir import private_dir, read_json, state_subdir, write_json
from fray.jobs.local import ended_status, follow_log, job_command, job_environment, missing_dir_message, read_log_end
from fray.jobs.policy import GRACE_VAR, kill_delay
from fray.jobs.reapers import Reapers
from fray.jobs.signals import STOP_MARK_VAR
from fray.types import JobInfo, JobStatus, RuntimeEnv

__all__ = ["DetachedJobs"]

_STARTED = b"started\n"  # the runner's one line to its submitter: the job's state is recorded
_RUNNER_START_TIMEOUT = 30.0
_NO_RUNNER_AFTER = 60.0  # a job with no state this long after submission: its runner never started
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class DetachedJobs:
    """The detached jobs in `root` (default: the jobs directory of the state directory, read at each use)."""

    def __init__(self, root: Path | None = None, stop_grace: float = 3.0) -> None:
        self._root = Path(root) if root is not None else None
        self.stop_grace = stop_grace
        self._reapers = Reapers()

    @property
    def root(self) -> Path:
        """The jobs directory, checked (fray.host.state_dir.private_dir) and made if missing."""
        return self._checked_root(create=True)

    def _checked_root(self, create: bool) -> Path:
        if self._root is None:
            return state_subdir("jobs", create=create)
        return private_dir(self._root, create)

    # ------------------------------------------------------------------ start
    def start(self, entrypoint: str | list[str], env: RuntimeEnv, working_dir: str, job_id: str | None = None) -> str:
        """Start a job that outlives this process; return once its runner has recorded it running (or failed)."""
        job_id = job_id or f"job-{uuid.uuid4().hex[:12]}"
        job_dir = self.root / job_id
        try:
            job_dir.mkdir(mode=0o700)  # atomic, across processes: of two starts of one id, one fails here
        except FileExistsError:
            raise JobExistsError(f"a job with id {job_id!r} exists in {self.root}") from None
        write_json(
            job_dir / "job.json",
            {
                "id": job_id,
                "entrypoint": entrypoint,
                "text": entrypoint if isinstance(entrypoint, str) else shlex.join(entrypoint),
                "env": _with_stop_mark(dict(env.env), job_dir),
                "packages": list(env.package_requirements),
                "working_dir": working_dir,
                "submission_time": time.time(),
            },
        )
        os.close(os.open(job_dir / "log", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        with open(job_dir / "runner.log", "ab") as errors:
            runner = subprocess.Popen(
                [sys.executable, "-m", "fray.jobs.detached", str(job_dir)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                cwd=job_dir,
                start_new_session=True,  # not in this process's group or session: a Ctrl-C here does not reach it
            )
        assert runner.stdout is not None
        started = _read_line(runner.stdout, _RUNNER_START_TIMEOUT) == _STARTED
        runner.stdout.close()
        self._reapers.add(runner, f"fray-runner-{job_id}")  # reaped if it ends while this process lives
        if not started:
            if runner.poll() is None:
                runner.kill()
            why = (job_dir / "runner.log").read_text(errors="replace")[-2000:].strip() or "no output"
            state = read_json(job_dir / "state.json") or {}
            if not JobStatus(state.get("status", "PENDING")).is_terminal:
                write_json(
                    job_dir / "state.json",
                    {**state, "status": "FAILED", "end_time": time.time(), "message": f"its runner failed: {why}"},
                )
        return job_id

    def close(self) -> None:
        """Stop and join the runners' reapers (fray.jobs.reapers); the jobs go on."""
        self._reapers.close()

    # ------------------------------------------------------------------ reading
    def _dir(self, job_id: str) -> Path:
        """The job's directory, checked: FrayError if it (or a directory above it in the state directory) is not a
        private one of this user's."""
        missing = JobNotFoundError(f"no job {job_id!r} here (it never existed or was deleted)")
        if not isinstance(job_id, str) or not _ID.fullmatch(job_id):
            raise missing
        try:
            job_dir = private_dir(self._checked_root(create=False) / job_id, create=False)
        except FileNotFoundError:
            raise missing from None
        if not (job_dir / "job.json").is_file():
            raise missing
        return job_dir

    def has(self, job_id: str) -> bool:
        try:
            self._dir(job_id)
        except JobNotFoundError:
            return False
        return True

    def info(self, job_id: str) -> JobInfo:
        job_dir = self._dir(job_id)
        spec = read_json(job_dir / "job.json")
        if spec is None:
            raise JobNotFoundError(f"no job {job_id!r} here (it was just deleted)")
        state = read_json(job_dir / "state.json") or {}
        status = JobStatus(state.get("status", "PENDING"))
        message = str(state.get("message", ""))
        if not status.is_terminal and not self._runner_alive(spec, state):
            state = read_json(job_dir / "state.json") or state  # it may have recorded the end just now
            status = JobStatus(state.get("status", "PENDING"))
            message = str(state.get("message", ""))
            if not status.is_terminal:
                status, message = JobStatus.FAILED, _runner_gone(job_id, state)
        return JobInfo(
            id=job_id,
            status=status,
            submission_time=spec.get("submission_time"),
            start_time=state.get("start_time"),
            end_time=state.get("end_time"),
            entrypoint=str(spec.get("text", "")),
            exit_code=state.get("exit_code"),
            message=message,
        )

    @staticmethod
    def _runner_alive(spec: dict[str, Any], state: dict[str, Any]) -> bool:
        runner = Identity.from_record(state.get("runner"))
        if runner is None:  # not started yet, or it never will
            return time.time() - float(spec.get("submission_time") or 0) < _NO_RUNNER_AFTER
        return runner.running()

    def list(self) -> list[JobInfo]:
        try:
            names = os.listdir(self._checked_root(create=False))
        except FileNotFoundError:
            return []
        infos = []
        for name in names:
            try:
                infos.append(self.info(name))
            except JobNotFoundError:  # being created or deleted right now
                continue
        infos.sort(key=lambda info: info.submission_time or 0.0)
        return infos

    def log_path(self, job_id: str) -> Path:
        return self._dir(job_id) / "log"

    def logs(self, job_id: str) -> str:
        return self.log_path(job_id).read_bytes().decode(errors="replace")

    def log_end(self, job_id: str, lines: int) -> str:
        return read_log_end(self.log_path(job_id), lines)

    def tail(self, job_id: str) -> Iterator[str]:
        """The job's output as it comes, until it has ended."""
        return follow_log(self.log_path(job_id), lambda: self.info(job_id).status.is_terminal)

    def processes(self, job_id: str) -> builtins.list[int]:
        """The process groups of a running job that are proven its own: its runner's and the job's (what ends it
        if killed)."""
        state = read_json(self._dir(job_id) / "state.json") or {}
        leaders = (Identity.from_record(state.get(key)) for key in ("runner", "leader"))
        return [leader.pid for leader in leaders if leader is not None and leader.group_is_ours()]

    def wait(self, job_id: str, timeout: float | None) -> JobInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            info = self.info(job_id)
            if info.status.is_terminal:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise GetTimeoutError(f"job {job_id} did not end within {timeout} s (status {info.status.name})")
            time.sleep(pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 0.5)

    # ------------------------------------------------------------------ stopping
    def stop(self, job_id: str) -> None:
        """End the job's process group (SIGTERM, SIGKILL after stop_grace seconds); it ends STOPPED. Returns once
        it has ended. A job that has already ended is left as it was (what is left of a job whose runner died is
        ended all the same)."""
        job_dir = self._dir(job_id)
        info = self.info(job_id)
        state = read_json(job_dir / "state.json") or {}
        if JobStatus(state.get("status", "PENDING")).is_terminal:
            return  # its runner reaped it and recorded the end: nothing of it is signalled again
        if info.status.is_terminal:  # its runner died first: end what is left of the job, if proven its own
            self._stop_leader(state)
            return
        _mark_stop(job_dir, "stopped by request")
        deadline = time.monotonic() + 10.0
        while "leader" not in state and not JobStatus(state.get("status", "PENDING")).is_terminal:
            if time.monotonic() > deadline or not self._runner_alive(read_json(job_dir / "job.json") or {}, state):
                break
            time.sleep(0.05)  # its runner is about to start it (or to see the stop request first)
            state = read_json(job_dir / "state.json") or {}
        if not JobStatus(state.get("status", "PENDING")).is_terminal:
            self._stop_leader(state, job_dir)
        runner = Identity.from_record(state.get("runner"))
        deadline = time.monotonic() + 10.0  # its runner records the end once it has reaped the job
        while time.monotonic() < deadline:
            state = read_json(job_dir / "state.json") or {}
            if JobStatus(state.get("status", "PENDING")).is_terminal:
                return
            if runner is None or not runner.running():
                break
            time.sleep(0.05)
        state = read_json(job_dir / "state.json") or {}
        if not JobStatus(state.get("status", "PENDING")).is_terminal:
            write_json(
                job_dir / "state.json",
                {
                    **state,
                    "status": "STOPPED",
                    "end_time": time.time(),
                    "message": "stopped by request (its runner was gone)",
                },
            )

    def _stop_leader(self, state: dict[str, Any], job_dir: Path | None = None) -> None:
        leader = Identity.from_record(state.get("leader"))
        job_env = ((read_json(job_dir / "job.json") or {}).get("env") or {}) if job_dir else {}
        grace = settings.JOB_STOP_GRACE.read(job_env)
        if leader is not None and grace is not None and leader.running():
            # a supervised job: its supervisor gives its ranks their grace (fray.jobs.local.LocalJobs.stop says why)
            try:
                os.kill(leader.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + kill_delay(grace)
            while group_members(leader.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            stop_group(leader, 1.0)
        elif leader is not None:
            stop_group(leader, self.stop_grace)

    def delete(self, job_id: str) -> None:
        """Stop the job if it runs, then forget it (its directory and log go)."""
        job_dir = self._dir(job_id)
        self.stop(job_id)
        shutil.rmtree(job_dir, ignore_errors=True)


def _runner_gone(job_id: str, state: dict[str, Any]) -> str:
    runner = Identity.from_record(state.get("runner"))
    pid = runner.pid if runner is not None else "?"
    message = f"its runner process (pid {pid}) died before the job ended: exit status unknown"
    leader = Identity.from_record(state.get("leader"))
    if leader is not None and leader.group_is_ours() and group_members(leader.pid):
        message += f"; its processes (group {leader.pid}) still run: `fray job stop {job_id}` ends them"
    return message


def _with_stop_mark(env: dict[str, str], job_dir: Path) -> dict[str, str]:
    """A supervised job's variables name its stop mark (fray.jobs.signals: a SIGTERM with the mark is a stop)."""
    return {**env, STOP_MARK_VAR: str(job_dir / "stop")} if GRACE_VAR in env else env


def _mark_stop(job_dir: Path, reason: str) -> None:
    try:
        (job_dir / "stop").write_text(reason)
    except FileExistsError:
        pass


def _stop_reason(job_dir: Path) -> str | None:
    try:
        return (job_dir / "stop").read_text().strip() or "stopped by request"
    except OSError:
        return None


def _read_line(stream: IO[bytes], timeout: float) -> bytes:
    """One line from a pipe, or b"" at EOF or after timeout seconds."""
    fd = stream.fileno()
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b""
        chunk = os.read(fd, 64)
        if not chunk:
            return line
        line += chunk
    return line


# ---------------------------------------------------------------------- the runner (its own process)
def run(job_dir: Path) -> int:
    """Start the job described in job_dir/job.json, record its state, wait for it and record how it ended."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only a stop request (SIGTERM) ends it
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    spec = read_json(job_dir / "job.json")
    if spec is None:
        print(f"fray.jobs.detached: no job.json in {job_dir}", file=sys.stderr)
        return 2
    runner = Identity.of(os.getpid())
    state: dict[str, Any] = {"status": "PENDING", "runner": runner.record() if runner else None}
    write_json(job_dir / "state.json", state)
    proc: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, frame: object) -> None:
        _mark_stop(job_dir, f"stopped: its runner received {signal.Signals(signum).name}")
        if proc is not None and proc.returncode is None:  # not reaped yet: its group is still the job's
            _killpg(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)

    def record(**changes: Any) -> None:
        state.update(changes)
        write_json(job_dir / "state.json", state)

    def started() -> None:  # tell the submitter, then let go of its pipe
        try:
            os.write(1, _STARTED)
        except OSError:  # the submitter is gone: nobody is waiting
            pass
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)

    def fail(message: str, log_line: str) -> int:
        with open(job_dir / "log", "ab") as log:
            log.write(log_line.encode())
        record(status="FAILED", end_time=time.time(), message=message)
        started()
        return 0

    env = RuntimeEnv(env=dict(spec.get("env") or {}), package_requirements=list(spec.get("packages") or []))
    site_dir = job_dir / "site-packages"
    argv, shell = job_command(spec["entrypoint"], env, site_dir)
    working_dir = str(spec["working_dir"])
    if _stop_reason(job_dir) is not None:
        record(status="STOPPED", end_time=time.time(), message="stopped before it started")
        started()
        return 0
    if not os.path.isdir(working_dir):
        return fail(f"the working directory {working_dir} does not exist", missing_dir_message(working_dir))
    with open(job_dir / "log", "ab") as log:
        try:
            proc = subprocess.Popen(
                argv[0] if shell else argv,
                shell=shell,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=job_environment(env, site_dir),
                cwd=working_dir,
                start_new_session=True,  # its own process group: a stop reaches every process of the job
            )
        except OSError as exc:  # e.g. argv[0] not found
            return fail(str(exc), f"fray: could not start {spec.get('text')!r}: {exc}\n")
    leader = Identity.of(proc.pid, zombie_ok=True)  # our child: nothing reaps it before we do
    record(
        status="RUNNING",
        pid=proc.pid,
        pgid=proc.pid,
        leader=leader.record() if leader else None,
        start_time=time.time(),
    )
    if _stop_reason(job_dir) is not None:  # asked while it was being started
        _killpg(proc.pid, signal.SIGTERM)
    started()
    code = proc.wait()
    reason = _stop_reason(job_dir)
    if reason is not None:
        record(status="STOPPED", end_time=time.time(), exit_code=code, message=reason)
    else:
        status, exit_code, message = ended_status(code)
        record(status=status.value, end_time=time.time(), exit_code=exit_code, message=message)
    return 0


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
